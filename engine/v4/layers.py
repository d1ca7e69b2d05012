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


class RMSNorm(nn.Module):
    """Weighted RMSNorm in fp32 (V4 keeps norm weights in fp32), output in the input dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = param(dim, dtype=torch.float32)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one fused op on CUDA (a decode step is launch-bound); the same formula as HF's
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps).to(x.dtype)


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
