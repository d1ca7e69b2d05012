"""Op name → the module (``module`` or ``module:ATTR``) holding its ``ParitySpec``. Add one line per op."""

from __future__ import annotations

import importlib

OPS: dict[str, str] = {
    "rmsnorm": "kernels.rmsnorm",
    "rmsnorm_residual": "kernels.rmsnorm:SPEC_RESIDUAL",
    "act_quant": "kernels.fp8_quant",
    "act_quant_ue8m0": "kernels.fp8_quant:SPEC_UE8M0",
    "act_dequant": "kernels.fp8_quant:SPEC_DEQUANT",
    "weight_dequant": "kernels.fp8_quant:SPEC_WEIGHT_DEQUANT",
    "rope": "kernels.rope",
    "silu_mul": "kernels.silu_mul",
    "silu_mul_quant": "kernels.silu_mul:SPEC_QUANT",
    "fp8_gemm": "kernels.fp8_gemm",
    "moe_experts": "kernels.moe",
    "noaux_tc": "kernels.routing:SPEC_TRITON",
    "mla_decode": "kernels.mla_decode:SPEC_DENSE",
    "paged_mla_decode": "kernels.mla_decode",
}


def load_spec(name: str):
    """The ``ParitySpec`` registered as ``name``; unknown names list the known ones."""
    if name not in OPS:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}")
    module, _, attr = OPS[name].partition(":")
    return getattr(importlib.import_module(module), attr or "SPEC")
