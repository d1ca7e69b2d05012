"""Op table: which implementation the engine calls for each hot op, per backend.

``backend="torch"`` (the default, and the oracle) uses the torch reference beside each kernel in
``kernels/<module>.py`` (``<op>_ref``): one definition of each op, shared with the kernel parity specs.
``backend="triton"`` looks up the Triton entry point of the same module by convention: the reference's
name without ``_ref``, same signature. Lookups are lazy, so an op is imported only when first called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

# op -> (kernels module, reference name). The Triton entry point is the reference name without "_ref".
OPS: dict[str, tuple[str, str]] = {
    "rmsnorm": ("kernels.rmsnorm", "rmsnorm_ref"),
    "rmsnorm_rope": ("kernels.rmsnorm", "rmsnorm_rope_ref"),
    "linear": ("kernels.gemv", "linear_ref"),
    "silu_mul_linear": ("kernels.gemv", "silu_mul_linear_ref"),
    "rope": ("kernels.rope", "rope_ref"),
    "act_quant": ("kernels.fp8_quant", "act_quant_ref"),
    "silu_mul": ("kernels.silu_mul", "silu_mul_ref"),
    "fp8_gemm": ("kernels.fp8_gemm", "fp8_gemm_ref"),
    "moe_route": ("kernels.routing", "noaux_tc_ref"),
    "moe_experts": ("kernels.moe", "moe_experts_ref"),
    "mla_decode": ("kernels.mla_decode", "mla_decode_ref"),
    "paged_mla_decode": ("kernels.mla_decode", "paged_mla_decode_ref"),
    "paged_kv_write": ("kernels.paged_kv", "paged_kv_write_ref"),
}

BACKENDS = ("torch", "triton")


class OpUnavailable(RuntimeError):
    """The requested backend has no implementation of an op."""


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

    @property
    def graph_safe(self) -> bool:
        """Whether a step built from these ops can be captured as a CUDA graph: the Triton entry points never
        synchronise with the host; the torch references (oracles) may (per-sequence loops over lengths)."""
        return all(self.backend_of(op) == "triton" for op in OPS)

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
