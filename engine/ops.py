"""Op table: which implementation the engine calls for each hot op, per backend.

``backend="torch"`` (the default, and the oracle) uses the torch reference beside each kernel in
``kernels/<module>.py`` (``<op>_ref``). ``backend="triton"`` looks up the Triton entry point of the same
module by convention: the reference's name without ``_ref``, same signature. Lookups are lazy, so a
torch-only run never imports triton. A few references are not in ``kernels/`` yet; until they are, the
engine's own torch version below stands in and fixes the signature the kernel must keep.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

# op -> (kernels module, reference name). The Triton entry point is the reference name without "_ref".
OPS: dict[str, tuple[str, str]] = {
    "rmsnorm": ("kernels.rmsnorm", "rmsnorm_ref"),
    "rope": ("kernels.rope", "rope_ref"),
    "act_quant": ("kernels.fp8_quant", "act_quant_ref"),
    "silu_mul": ("kernels.silu_mul", "silu_mul_ref"),
    "fp8_gemm": ("kernels.fp8_gemm", "fp8_gemm_ref"),
    "moe_route": ("kernels.routing", "noaux_tc_ref"),
    "moe_experts": ("kernels.moe", "moe_experts_ref"),
    "mla_decode": ("kernels.mla_decode", "mla_decode_ref"),
}

BACKENDS = ("torch", "triton")


class OpUnavailable(RuntimeError):
    """The requested backend has no implementation of an op."""


# --- torch stand-ins for references not yet in kernels/ (same signatures the kernels must keep) ---------


def _fp8_gemm(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """w8a8 block GEMM ``a[M,K] @ b[N,K]^T``: ``a_s`` per 1×128 of ``a``, ``b_s`` per 128×128 of ``b``;
    dequantised and accumulated in fp32."""
    from kernels.fp8_quant import act_dequant_ref, weight_dequant_ref

    af = act_dequant_ref(a, a_s)
    bf = weight_dequant_ref(b, b_s)
    return (af @ bf.t()).to(out_dtype)


def _moe_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Routed experts: ``sum_k weights[t,k] * down[e](silu(gate[e] x) * up[e] x)`` with ``e = ids[t,k]``.
    ``w_gate``/``w_up`` are ``[E, I, H]``, ``w_down`` ``[E, H, I]``; weights fp32, output ``x.dtype``."""
    from kernels.silu_mul import silu_mul_ref

    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w_gate.shape[0]).tolist()
    tok = order // ids.shape[1]
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        sel = order[start:start + n]
        t = tok[start:start + n]
        start += n
        xe = x[t]
        h = silu_mul_ref(torch.cat([xe @ w_gate[e].t(), xe @ w_up[e].t()], dim=-1))
        ye = h @ w_down[e].t()
        out.index_add_(0, t, ye.float() * weights.flatten()[sel].unsqueeze(-1))
    return out.to(x.dtype)


def _mla_decode(q_latent: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, pe: torch.Tensor,
                lengths: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA for one new token per sequence over a latent cache.

    ``q_latent[B,H,C]``, ``q_pe[B,H,R]``, ``kv[B,T,C]``, ``pe[B,T,R]``; sequence ``b`` attends to cache rows
    ``0..lengths[b]-1`` only. Returns ``(o_latent[B,H,C] in q's dtype, lse[B,H] fp32)``.
    """
    scores = (torch.einsum("bhc,btc->bht", q_latent.float(), kv.float())
              + torch.einsum("bhr,btr->bht", q_pe.float(), pe.float())) * scale
    t = torch.arange(kv.shape[1], device=kv.device)
    scores = scores.masked_fill((t[None, :] >= lengths[:, None]).unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.einsum("bht,btc->bhc", torch.exp(scores - lse.unsqueeze(-1)), kv.float())
    return o.to(q_latent.dtype), lse


_STANDINS: dict[str, Callable] = {"fp8_gemm": _fp8_gemm, "moe_experts": _moe_experts, "mla_decode": _mla_decode}


def _lookup(op: str, backend: str) -> Callable:
    if op not in OPS:
        raise OpUnavailable(f"unknown op {op!r}; known ops: {', '.join(OPS)}")
    module_name, ref_name = OPS[op]
    name = ref_name if backend == "torch" else ref_name.removesuffix("_ref")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        module = None
    fn = getattr(module, name, None) if module is not None else None
    if fn is None and backend == "torch":
        fn = _STANDINS.get(op)
    if fn is None:
        where = module_name.replace(".", "/") + ".py"
        raise OpUnavailable(f"op {op!r} has no {backend} implementation yet: {where} defines no {name!r}")
    return fn


def _backend_for(op: str, backend: str | dict[str, str]) -> str:
    choice = backend.get(op, backend.get("default", "torch")) if isinstance(backend, dict) else backend
    if choice not in BACKENDS:
        raise OpUnavailable(f"backend for op {op!r} is {choice!r}; choose one of {', '.join(BACKENDS)}")
    return choice


@dataclass
class OpSet:
    """The resolved implementations a model calls. ``backend`` is one name for every op, or a dict
    ``{op: backend, "default": backend}`` to move ops to Triton one at a time."""

    backend: str | dict[str, str] = "torch"

    def __post_init__(self) -> None:
        if isinstance(self.backend, dict):
            unknown = set(self.backend) - set(OPS) - {"default"}
            if unknown:
                raise OpUnavailable(f"unknown op(s) in backend map: {', '.join(sorted(unknown))}")
        self._cache: dict[str, Callable] = {}

    def backend_of(self, op: str) -> str:
        return _backend_for(op, self.backend)

    def __getattr__(self, op: str) -> Callable:
        if op.startswith("_") or op not in OPS:
            raise AttributeError(op)
        fn = self._cache.get(op)
        if fn is None:
            fn = self._cache[op] = _lookup(op, self.backend_of(op))
        return fn

    def resolve_all(self) -> dict[str, str]:
        """Resolve every op now (so a missing Triton op fails at load, not mid-decode); op -> backend."""
        for op in OPS:
            getattr(self, op)
        return {op: self.backend_of(op) for op in OPS}
