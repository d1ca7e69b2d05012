"""Random DeepSeek-V3 checkpoints in HF layout, so tests and benchmarks need no downloads.

The weights are scaled so activations stay O(1) through the layers and the logits are spread out
(near-ties rare), which keeps greedy decoding a meaningful comparison. ``fp8=True`` stores every
projection the way DeepSeek's release does: e4m3 with a ``weight_scale_inv`` per 128×128 block (the
router, norms, embedding and head stay in high precision).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from engine.config import parse_config

FP8_MAX = 448.0

# hidden 64, 2 layers (1 dense + 1 MoE), 4 heads, 8 experts in 4 groups, one MTP layer.
TINY = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 48,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 3,
    "n_group": 4,
    "topk_group": 2,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "hidden_act": "silu",
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "float32",
}

# The benchmark's "small" config: hidden 2048, 8 layers, 16 heads, q_lora null, kv_lora 512,
# 64 routed experts top-6, 2 shared.
SMALL = dict(
    TINY,
    vocab_size=32000, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
    num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
    num_experts_per_tok=6, n_group=1, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.0,
    num_nextn_predict_layers=0, max_position_embeddings=4096,
    rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
)

PRESETS = {"tiny": TINY, "small": SMALL}

# Weights kept in high precision in an fp8 checkpoint (the rest are projections, stored e4m3).
_HIGH_PRECISION = re.compile(r"(norm\.weight|gate\.weight|e_score_correction_bias|embed_tokens\.weight|"
                             r"lm_head\.weight|shared_head\.head\.weight)$")


def expected_shapes(cfg_dict: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of an HF DeepSeek-V3 checkpoint for this config, by name (experts unstacked)."""
    from engine.loader import _targets
    from engine.model import DeepseekV3

    cfg = parse_config(cfg_dict, "config")
    with torch.device("meta"):
        model = DeepseekV3(cfg, max_positions=1)
    shapes: dict[str, tuple[int, ...]] = {}
    for _, hf_names, shape in _targets(model):
        for n in hf_names:
            shapes[n] = shape
    for j in range(cfg.num_nextn_predict_layers):  # MTP copies of the shared embedding and head
        p = f"model.layers.{cfg.num_hidden_layers + j}."
        shapes[p + "embed_tokens.weight"] = (cfg.vocab_size, cfg.hidden_size)
        shapes[p + "shared_head.head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def random_weights(cfg_dict: dict, seed: int = 0, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Random HF-named tensors for ``cfg_dict`` (unquantised)."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = {}
    shapes = expected_shapes(cfg_dict)
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, device=device)
        elif name.endswith("e_score_correction_bias"):
            t = 0.05 * torch.randn(shape, generator=g, device=device)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(shape, generator=g, device=device)
        else:  # projections, router and head: unit-variance outputs for unit-variance inputs
            t = torch.randn(shape, generator=g, device=device) / math.sqrt(shape[-1])
            if name.endswith("lm_head.weight") or name.endswith("shared_head.head.weight"):
                t = t * 4.0  # spread the logits so greedy choices are rarely near-ties
        keep_fp32 = name.endswith("e_score_correction_bias") or name.endswith("mlp.gate.weight")
        out[name] = t.to(torch.float32 if keep_fp32 else dtype)
    n = cfg_dict["num_hidden_layers"]
    for j in range(cfg_dict.get("num_nextn_predict_layers", 0) or 0):
        p = f"model.layers.{n + j}."
        out[p + "embed_tokens.weight"] = out["model.embed_tokens.weight"].clone()
        out[p + "shared_head.head.weight"] = out["lm_head.weight"].clone()
    return out


def quantize_fp8(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``w[N, K]`` → (e4m3 weight, ``weight_scale_inv[ceil(N/b), ceil(K/b)]``), amax/448 per block."""
    n, k = w.shape
    nb, kb = math.ceil(n / block), math.ceil(k / block)
    padded = torch.zeros(nb * block, kb * block, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    blocks = padded.view(nb, block, kb, block)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-4) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(nb * block, kb * block)[:n, :k]
    return q.to(torch.float8_e4m3fn), scale


def to_fp8_checkpoint(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in tensors.items():
        if t.dim() == 2 and not _HIGH_PRECISION.search(name):
            q, s = quantize_fp8(t)
            out[name], out[name + "_scale_inv"] = q, s
        else:
            out[name] = t
    return out


def save_checkpoint(out_dir: str | Path, cfg_dict: dict, tensors: dict[str, torch.Tensor],
                    max_shard_bytes: int = 2 << 20) -> Path:
    """Write config.json, safetensors shards (HF's ``model-0000i-of-0000n`` naming) and the index file."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1, sort_keys=True))
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    return out


def write_tiny(out_dir: str | Path, *, preset: str | dict = "tiny", seed: int = 0, fp8: bool = False,
               dtype: torch.dtype = torch.float32, **overrides) -> Path:
    """A random checkpoint of ``preset`` (with config ``overrides``) in ``out_dir``; returns the dir."""
    cfg_dict = dict(PRESETS[preset] if isinstance(preset, str) else preset, **overrides)
    tensors = random_weights(cfg_dict, seed=seed, dtype=dtype)
    if fp8:
        tensors = to_fp8_checkpoint(tensors)
        cfg_dict["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                           "weight_block_size": [128, 128]}
    cfg_dict["torch_dtype"] = {torch.float32: "float32", torch.bfloat16: "bfloat16"}.get(dtype, "float32")
    return save_checkpoint(out_dir, cfg_dict, tensors)
