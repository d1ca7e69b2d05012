"""Building blocks shared by the V4 parts: linear layers (dense, fp8 block-quantised), norms, partial rope.

Parameter names follow HF's ``DeepseekV4ForCausalLM`` so the loader copies tensors by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.v4.config import V4Config
from kernels.rope import yarn_freqs

FP8 = torch.float8_e4m3fn


def param(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """``y = x Wᵀ``. An fp8 ``weight`` carries ``weight_scale_inv`` (one scale per 128×128 block) and is
    dequantised per call, or, with ``qat=True``, multiplied as w8a8 with activations block-quantised first
    (how the checkpoint was trained)."""

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = param(out_features, in_features, dtype=dtype)
        self.weight_scale_inv: torch.Tensor | None = None
        self.qat = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != FP8:
            return F.linear(x, self.weight)
        if self.qat and self.weight_scale_inv is not None:
            from kernels.fp8_gemm import fp8_gemm_ref
            from kernels.fp8_quant import act_quant_ref

            lead = x.shape[:-1]
            xq, xs = act_quant_ref(x.reshape(-1, x.shape[-1]))
            return fp8_gemm_ref(xq, xs, self.weight, self.weight_scale_inv, out_dtype=x.dtype).view(*lead, -1)
        return F.linear(x, self.dense_weight(x.dtype))

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        if self.weight.dtype == FP8:
            from kernels.fp8_quant import weight_dequant_ref

            if self.weight_scale_inv is None:
                raise ValueError("an fp8 weight needs its weight_scale_inv")
            return weight_dequant_ref(self.weight, self.weight_scale_inv, out_dtype=dtype)
        return self.weight.to(dtype)


def linears_on(x: torch.Tensor, mods: list[Linear]) -> list[torch.Tensor]:
    """``[m(x) for m in mods]`` with one GEMM for the dense weights (fp8 ones keep their own path): those
    weights become row blocks of one ``[Σ out, in]`` buffer (views, no second copy), made on first use and
    again if a weight was replaced since. A decode step is launch-bound, and the projections a block input
    feeds (query, key, the compressor's and the indexer's) are many small GEMMs."""
    dense = [m for m in mods if m.weight.dtype != FP8 and m.weight.dtype == mods[0].weight.dtype]
    if len(dense) < 2:
        return [m(x) for m in mods]
    ys = dict(zip(map(id, dense), F.linear(x, _fused_weight(dense)).split([m.out_features for m in dense], dim=-1)))
    return [ys[id(m)] if id(m) in ys else m(x) for m in mods]


def _fused_weight(mods: list[Linear]) -> torch.Tensor:
    cached = mods[0].__dict__.get("_fused_with")
    if cached is not None:
        buf, members = cached
        if len(members) == len(mods) and all(a is b for a, b in zip(members, mods)):
            off, ok = 0, True
            for m in mods:
                w = m.weight
                ok = ok and w.device == buf.device and w.dtype == buf.dtype and w.shape == (m.out_features, buf.shape[1]) \
                    and w.data_ptr() == buf[off:].data_ptr()
                off += m.out_features
            if ok:
                return buf
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, like the parameters they replace
        buf = torch.cat([m.weight.detach() for m in mods], dim=0)
    off = 0
    for m in mods:  # the parameters become views of the buffer: state_dict and loading still see each one
        m.weight = nn.Parameter(buf[off:off + m.out_features], requires_grad=False)
        off += m.out_features
    mods[0].__dict__["_fused_with"] = (buf, list(mods))  # not a submodule: a plain attribute
    return buf


class RMSNorm(nn.Module):
    """Weighted RMSNorm in fp32 (V4 keeps norm weights in fp32), output in the input dtype. With ``ops``, the
    op set's ``rmsnorm`` (the Triton backend: one kernel that reads bf16 and writes bf16 with fp32 math)."""

    def __init__(self, dim: int, eps: float, ops=None):
        super().__init__()
        self.weight = param(dim, dtype=torch.float32)
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ops is not None:
            return self.ops.rmsnorm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`kernels.rmsnorm.rmsnorm_ref`'s math (HF's: fp32, weight in fp32, one rounding at the end) as
    torch's fused op: the torch backend's ``rmsnorm``."""
    return F.rms_norm(x.float(), (x.shape[-1],), weight, eps).to(x.dtype)


def unit_rmsnorm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight (the per-head query norm and the hyper-connection input norm)."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def rope_rot(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``cos + i·sin`` as complex64, what :func:`rope_tail` multiplies by (its conjugate rotates back)."""
    return torch.complex(cos.float(), sin.float())


def rope_tables(cfg: V4Config, kind: str, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)`` ``[max_pos, rope_dim/2]``. ``main``: plain rope at ``rope_theta`` (sliding layers);
    ``compress``: ``compress_rope_theta`` with YaRN when configured, unscaled in magnitude (CSA/HCA layers,
    their compressors and the indexer)."""
    r = cfg.qk_rope_head_dim
    if kind == "main":
        return yarn_freqs(r, max_pos, cfg.rope_theta)
    y = cfg.yarn
    if y is None:
        return yarn_freqs(r, max_pos, cfg.compress_rope_theta)
    return yarn_freqs(r, max_pos, cfg.compress_rope_theta, y.factor, y.original_max_position_embeddings,
                      y.beta_fast, y.beta_slow)


def rope_tail(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Interleaved rope on the trailing ``2·rot.shape[-1]`` channels of ``x`` (V4 lays heads out ``[nope | rope]``).
    ``rot`` is ``cos + i·sin`` (complex64, see :func:`rope_rot`) broadcasting against ``x[..., :rope_dim/2]``.
    :func:`kernels.rope.rope_ref`'s math (fp32, ``(x0·c − x1·s, x0·s + x1·c)`` per pair) as one complex
    product, so a decode step launches a few kernels per rope instead of a dozen."""
    return rope_tail_(x.clone(), rot)


def rope_tail_(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """:func:`rope_tail` in place, for a temporary ``x`` nothing else holds (one kernel fewer per rope)."""
    r = 2 * rot.shape[-1]
    tail = x[..., -r:].float()
    rot = torch.view_as_complex(tail.reshape(*tail.shape[:-1], r // 2, 2)) * rot
    x[..., -r:] = torch.view_as_real(rot).flatten(-2)
    return x
