"""Op name → the module (``module`` or ``module:ATTR``) holding its ``ParitySpec``. Add one line per op."""

from __future__ import annotations

import importlib

OPS: dict[str, str] = {
    "rmsnorm": "kernels.rmsnorm",
    "rmsnorm_residual": "kernels.rmsnorm:SPEC_RESIDUAL",
    "rmsnorm_rope": "kernels.rmsnorm:SPEC_ROPE",
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
    "linear": "kernels.gemv",
    "silu_mul_linear": "kernels.gemv:SPEC_SILU",
    "paged_kv_write": "kernels.paged_kv",
    "kv584_store": "kernels.kv584:SPEC_STORE",
    "kv584_load": "kernels.kv584:SPEC_LOAD",
    "sparse_mla_decode": "kernels.sparse_mla",
    "compress_store": "kernels.compressor",
    "hc_pre": "kernels.hc:SPEC_PRE",
    "hc_post": "kernels.hc:SPEC_POST",
    "indexer_topk": "kernels.indexer",
    "mxfp4_dequant": "kernels.mxfp4:SPEC_DEQUANT",
    "mxfp4_moe": "kernels.mxfp4:SPEC_MOE",
    "mxfp4_moe_w4a8": "kernels.mxfp4:SPEC_W4A8",
    "sqrtsoftplus_topk": "kernels.hash_routing:SPEC_TOPK",
    "hash_routing": "kernels.hash_routing:SPEC_HASH",
}


def load_spec(name: str):
    """The ``ParitySpec`` registered as ``name``; unknown names list the known ones."""
    if name not in OPS:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}")
    module, _, attr = OPS[name].partition(":")
    return getattr(importlib.import_module(module), attr or "SPEC")
