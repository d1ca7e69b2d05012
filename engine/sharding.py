"""Tensor-parallel placement of every weight, in one table for any rank and world size.

``TP_SHARDING`` is a plain literal dict so drift rules can read it with a tree-sitter query. Keys are HF
weight names with the ``model.layers.<i>.`` prefix and any expert index (``experts.<e>.``) replaced by
``*``; values are:

- ``"column"``: split dim 0 (output features; vocab rows for the embedding), no reduction needed after;
- ``"row"``: split dim 1 (input features); partial outputs are summed across ranks (all-reduce);
- ``"replicated"``: every rank holds the whole tensor.

A ``weight_scale_inv`` follows its weight, at 128×128-block granularity.
"""

from __future__ import annotations

import re

import torch

TP_SHARDING = {
    "model.embed_tokens.weight": "column",
    "model.norm.weight": "replicated",
    "lm_head.weight": "column",
    "*.input_layernorm.weight": "replicated",
    "*.post_attention_layernorm.weight": "replicated",
    "*.self_attn.q_proj.weight": "column",
    "*.self_attn.q_a_proj.weight": "replicated",
    "*.self_attn.q_a_layernorm.weight": "replicated",
    "*.self_attn.q_b_proj.weight": "column",
    "*.self_attn.kv_a_proj_with_mqa.weight": "replicated",
    "*.self_attn.kv_a_layernorm.weight": "replicated",
    "*.self_attn.kv_b_proj.weight": "column",
    "*.self_attn.o_proj.weight": "row",
    "*.mlp.gate_proj.weight": "column",
    "*.mlp.up_proj.weight": "column",
    "*.mlp.down_proj.weight": "row",
    "*.mlp.gate.weight": "replicated",
    "*.mlp.gate.e_score_correction_bias": "replicated",
    "*.mlp.experts.*.gate_proj.weight": "column",
    "*.mlp.experts.*.up_proj.weight": "column",
    "*.mlp.experts.*.down_proj.weight": "row",
    "*.mlp.shared_experts.gate_proj.weight": "column",
    "*.mlp.shared_experts.up_proj.weight": "column",
    "*.mlp.shared_experts.down_proj.weight": "row",
    "*.embed_tokens.weight": "column",
    "*.enorm.weight": "replicated",
    "*.hnorm.weight": "replicated",
    "*.eh_proj.weight": "replicated",
    "*.shared_head.norm.weight": "replicated",
    "*.shared_head.head.weight": "column",
}

_LAYER = re.compile(r"^model\.layers\.\d+\.")
_EXPERT = re.compile(r"\.experts\.\d+\.")


class ShardingError(ValueError):
    """A weight with no placement, or one that does not split evenly."""


def pattern_of(name: str) -> str:
    """The table key for an HF weight name (``weight_scale_inv`` maps to its weight's key)."""
    base = name.removesuffix("_scale_inv")
    return _EXPERT.sub(".experts.*.", _LAYER.sub("*.", base))


def placement(name: str) -> str:
    key = pattern_of(name)
    try:
        return TP_SHARDING[key]
    except KeyError:
        raise ShardingError(f"no tensor-parallel placement for {name!r} (table key {key!r}) in engine/sharding.py") from None


def shard(name: str, tensor: torch.Tensor, rank: int, world: int, block: int = 128) -> torch.Tensor:
    """This rank's slice of ``tensor`` (a view). Scales are split in blocks, so an fp8 weight's split
    must fall on a ``block`` boundary."""
    if not 0 <= rank < world:
        raise ShardingError(f"rank {rank} is outside world size {world}")
    kind = placement(name)
    if kind == "replicated" or world == 1:
        return tensor
    dim = 0 if kind == "column" else 1
    if tensor.dim() < dim + 1:
        raise ShardingError(f"{name}: {kind}-parallel needs dim {dim}, tensor has shape {tuple(tensor.shape)}")
    size = tensor.shape[dim]
    if size % world:
        raise ShardingError(f"{name}: dim {dim} of size {size} does not split over {world} ranks ({kind}-parallel)")
    part = size // world
    if name.endswith("_scale_inv") or tensor.dtype == torch.float8_e4m3fn:
        full = size * (block if name.endswith("_scale_inv") else 1)
        if (full // world) % block:
            raise ShardingError(f"{name}: a {kind}-parallel split of {full // world} is not a multiple of the "
                                f"{block}-wide fp8 scale block")
    return tensor.narrow(dim, rank * part, part)


def local_size(size: int, world: int, what: str) -> int:
    if size % world:
        raise ShardingError(f"{what}={size} does not split over {world} ranks")
    return size // world
