"""Random DeepSeek-V4 checkpoints in HF layout (``DeepseekV4ForCausalLM``'s names), for tests and benchmarks.

The tiny preset exercises every part at sizes a CPU runs in milliseconds: all three attention types with
compression rates small enough to emit entries within a short prompt (CSA 4, HCA 8), a sliding window
shorter than the prompts, an indexer top-k below the entry count, hash and top-k MoE layers, and a
SwiGLU limit low enough that the clamp fires. ``fp8=True`` stores the projections e4m3 with a
``weight_scale_inv`` per 128×128 block, except those V4 releases keep in bf16 (compressor and indexer
projections); ``mxfp4=True`` packs the routed experts as e2m1 with UE8M0 scales per 32.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from engine.tiny import quantize_fp8, save_checkpoint
from engine.v4.config import CSA, HCA, SLIDING, parse_v4_config

TINY = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "vocab_size": 256,
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "q_lora_rank": 32,
    "partial_rotary_factor": 0.25,
    "num_experts_per_tok": 2,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "layer_types": [SLIDING, CSA, HCA, CSA],
    "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe"],
    "compress_rates": {CSA: 4, HCA: 8},
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                        "beta_fast": 32, "beta_slow": 1},
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "swiglu_limit": 1.5,
    "sliding_window": 8,
    "o_groups": 2,
    "o_lora_rank": 16,
    "index_n_heads": 8,  # with few heads, relu zeros on every head tie entries at score 0 too often
    "index_head_dim": 16,
    "index_topk": 3,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}

# The V4-Flash config HF's docs name (deepseek-ai/DeepSeek-V4-Flash), for full-size parity and benchmarks.
FLASH = dict(
    TINY, vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43,
    num_attention_heads=64, head_dim=512, q_lora_rank=1024, partial_rotary_factor=64 / 512, num_experts_per_tok=6,
    n_routed_experts=256, layer_types=None, mlp_layer_types=None, compress_rates={CSA: 4, HCA: 128},
    swiglu_limit=10.0, sliding_window=128, o_groups=8, o_lora_rank=1024, index_n_heads=64, index_head_dim=128,
    index_topk=512, max_position_embeddings=1048576,
    rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
)
# A small model for the engine benchmark: real head/rope/indexer widths, few layers and experts.
SMALL = dict(
    TINY, vocab_size=32000, hidden_size=1024, moe_intermediate_size=512, num_hidden_layers=4,
    num_attention_heads=16, head_dim=512, q_lora_rank=512, partial_rotary_factor=64 / 512, num_experts_per_tok=6,
    n_routed_experts=32, compress_rates={CSA: 4, HCA: 128}, swiglu_limit=10.0, sliding_window=128, o_groups=4,
    o_lora_rank=256, index_n_heads=16, index_head_dim=128, index_topk=64, max_position_embeddings=4096,
)
PRESETS = {"tiny": TINY, "small": SMALL}

# kept high precision in an fp8 checkpoint: norms, router, hyper-connections, sinks, biases, embedding, head,
# and the compressor/indexer projections V4 releases ship in bf16
_HIGH_PRECISION = re.compile(r"(norm\.weight|gate\.weight|embed_tokens\.weight|lm_head\.weight|"
                             r"compressor\.(indexer\.)?(kv_proj|gate_proj)\.weight|weights_proj\.weight)$")


def expected_shapes(cfg_dict: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every tensor of an HF DeepSeek-V4 checkpoint for this config: name → (shape, dense dtype)."""
    from engine.v4.model import DeepseekV4

    cfg = parse_v4_config(cfg_dict, "config")
    with torch.device("meta"):
        model = DeepseekV4(cfg, max_positions=1)
    out = {n: (tuple(p.shape), p.dtype) for n, p in model.named_parameters()}
    out.update({n: (tuple(b.shape), b.dtype) for n, b in model.named_buffers()})
    return out


def random_weights(cfg_dict: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random HF-named tensors: O(1) activations through the layers, spread-out logits, nonzero sinks,
    biases and hyper-connection bases so each of them matters."""
    g = torch.Generator().manual_seed(seed)
    cfg = parse_v4_config(cfg_dict, "config")
    out: dict[str, torch.Tensor] = {}
    for name, (shape, pdtype) in expected_shapes(cfg_dict).items():
        if name.endswith("tid2eid"):
            t = torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[: cfg.num_experts_per_tok]
                             for _ in range(shape[0])])
            out[name] = t
            continue
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("e_score_correction_bias"):
            t = 0.05 * torch.randn(shape, generator=g)
        elif name.endswith("sinks"):
            t = torch.randn(shape, generator=g)
        elif name.endswith("position_bias"):
            t = 0.5 * torch.randn(shape, generator=g)
        elif name.endswith(("hc.base", "hc_base")):
            t = 0.5 * torch.randn(shape, generator=g)
        elif name.endswith(("hc.scale", "hc_scale")):
            t = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(shape, generator=g)
        else:  # projections: unit-variance outputs for unit-variance inputs
            t = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
            if name.endswith("lm_head.weight"):
                t = t * 4.0
        out[name] = t.to(torch.float32 if pdtype == torch.float32 else dtype)
    return out


def to_fp8(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        if t.dim() == 2 and t.is_floating_point() and name.endswith(".weight") and not _HIGH_PRECISION.search(name):
            q, s = quantize_fp8(t)
            out[name], out[name + "_scale_inv"] = q, s
        else:
            out[name] = t
    return out


def to_mxfp4_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from kernels.mxfp4 import mxfp4_quantize

    out = {}
    for name, t in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[name], out[name + "_scale_inv"] = mxfp4_quantize(t)
        else:
            out[name] = t
    return out


def write_tiny(out_dir: str | Path, *, preset: str | dict = "tiny", seed: int = 0, fp8: bool = False,
               mxfp4: bool = False, dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """A random V4 checkpoint of ``preset`` (with config ``overrides``) in ``out_dir``; returns the dir."""
    cfg_dict = dict(PRESETS[preset] if isinstance(preset, str) else preset, **overrides)
    tensors = random_weights(cfg_dict, seed=seed, dtype=dtype)
    if mxfp4:
        tensors = to_mxfp4_experts(tensors)
    if fp8:
        tensors = to_fp8(tensors)
    if fp8 or mxfp4:
        cfg_dict["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                           "weight_block_size": [128, 128], "scale_fmt": "float",
                                           "expert_dtype": "fp4" if mxfp4 else "fp8"}
    cfg_dict["torch_dtype"] = {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype, "float32")
    return save_checkpoint(out_dir, cfg_dict, tensors)
