"""DeepSeek-V4 model config, read from a Hugging Face ``config.json``.

The legacy spellings older checkpoints ship (``compress_ratios`` per layer, ``compress_rate_csa/hca``,
``num_hash_layers``, ``qk_rope_head_dim``) are folded in as HF's ``DeepseekV4Config`` does, so the same
file builds the same model on both sides. Every problem is a :class:`ConfigError` naming the file and field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.config import ConfigError, Yarn, _float, _int, read_config_json

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
MLP_TYPES = ("hash_moe", "moe")
SCORING = ("sqrtsoftplus", "softmax", "sigmoid")
_RATE_TO_TYPE = {0: SLIDING, 4: CSA, 128: HCA}


@dataclass(frozen=True)
class V4Config:
    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    q_lora_rank: int
    qk_rope_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    layer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    compress_rates: dict[str, int]
    sliding_window: int
    o_groups: int
    o_lora_rank: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    scoring_func: str
    routed_scaling_factor: float
    swiglu_limit: float
    rope_theta: float
    compress_rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    yarn: Yarn | None = None  # applies to the compress rope only (CSA/HCA layers, compressors, indexer)
    fp8_block: tuple[int, int] | None = None
    scale_fmt: str = "float"  # dense fp8 scales: fp32 ("float") or UE8M0 bytes ("ue8m0")
    expert_dtype: str | None = None  # "fp8" | "fp4" (MXFP4) for quantised experts
    tie_word_embeddings: bool = False
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def compress_rate(self, layer: int) -> int:
        """Source tokens per compressed entry of ``layer`` (0 for a sliding-only layer)."""
        t = self.layer_types[layer]
        return 0 if t == SLIDING else self.compress_rates[t]


def _layer_types(d: dict, n: int, where: str) -> tuple[str, ...]:
    lt = d.get("layer_types")
    if lt is None and d.get("compress_ratios") is not None:
        ratios = d["compress_ratios"]
        if not isinstance(ratios, list) or any(r not in _RATE_TO_TYPE for r in ratios):
            raise ConfigError(f"{where}: field 'compress_ratios' must list rates from {sorted(_RATE_TO_TYPE)}, "
                              f"got {ratios!r}")
        lt = [_RATE_TO_TYPE[r] for r in ratios]
    if lt is None:  # HF's default: two HCA layers, then CSA/HCA interleaved
        lt = [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
    if not isinstance(lt, list) or any(t not in LAYER_TYPES for t in lt):
        raise ConfigError(f"{where}: field 'layer_types' entries must be one of {LAYER_TYPES}, got {lt!r}")
    lt = lt[:n]
    if len(lt) != n:
        raise ConfigError(f"{where}: field 'layer_types' has {len(lt)} entries for {n} 'num_hidden_layers'")
    return tuple(lt)


def _mlp_types(d: dict, n: int, where: str) -> tuple[str, ...]:
    mt = d.get("mlp_layer_types")
    if mt is None:
        n_hash = _int(d, "num_hash_layers", where, 3, minimum=0)
        mt = ["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash)
    if not isinstance(mt, list) or any(t not in MLP_TYPES for t in mt):
        raise ConfigError(f"{where}: field 'mlp_layer_types' entries must be one of {MLP_TYPES}, got {mt!r}")
    mt = mt[:n]
    if len(mt) != n:
        raise ConfigError(f"{where}: field 'mlp_layer_types' has {len(mt)} entries for {n} 'num_hidden_layers'")
    return tuple(mt)


def _compress_rates(d: dict, where: str) -> dict[str, int]:
    rates = d.get("compress_rates")
    if rates is None:
        rates = {CSA: 4, HCA: 128}
    if not isinstance(rates, dict):
        raise ConfigError(f"{where}: field 'compress_rates' must be an object, got {rates!r}")
    rates = dict(rates)
    for legacy, t in (("compress_rate_csa", CSA), ("compress_rate_hca", HCA)):
        if d.get(legacy) is not None:
            rates[t] = d[legacy]
    for t in (CSA, HCA):
        if t not in rates:
            raise ConfigError(f"{where}: field 'compress_rates' lacks {t!r}")
        _int(rates, t, f"{where} (compress_rates)")
    return {CSA: rates[CSA], HCA: rates[HCA]}


def _yarn(d: dict, where: str) -> Yarn | None:
    rp = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise ConfigError(f"{where}: field 'rope_parameters' must be an object, got {rp!r}")
    if isinstance(rp.get("compress"), dict):
        rp = rp["compress"]
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind != "yarn":
        raise ConfigError(f"{where}: field 'rope_parameters.rope_type' is {kind!r}; only 'yarn' or 'default'")
    sub = f"{where} (rope_parameters)"
    if rp.get("attention_factor", 1.0) != 1.0:
        raise ConfigError(f"{sub}: field 'attention_factor' must be 1.0 for DeepSeek-V4 (the compress rope is "
                          f"not rescaled), got {rp['attention_factor']!r}")
    return Yarn(factor=_float(rp, "factor", sub), original_max_position_embeddings=_int(
        rp, "original_max_position_embeddings", sub), beta_fast=_float(rp, "beta_fast", sub, 32.0),
        beta_slow=_float(rp, "beta_slow", sub, 1.0))


def _quant(d: dict, where: str) -> tuple[tuple[int, int] | None, str, str | None]:
    qc = d.get("quantization_config")
    if qc is None:
        return None, "float", None
    if not isinstance(qc, dict):
        raise ConfigError(f"{where}: field 'quantization_config' must be an object")
    if qc.get("quant_method") not in (None, "fp8"):
        raise ConfigError(f"{where}: field 'quantization_config.quant_method' is {qc.get('quant_method')!r}; "
                          "only 'fp8' (with fp8 or fp4 experts) is supported")
    blk = qc.get("weight_block_size", [128, 128])
    if not (isinstance(blk, list) and len(blk) == 2 and all(isinstance(b, int) and b > 0 for b in blk)):
        raise ConfigError(f"{where}: field 'quantization_config.weight_block_size' must be [rows, cols], got {blk!r}")
    fmt = qc.get("scale_fmt", "float")
    if fmt not in ("float", "ue8m0"):
        raise ConfigError(f"{where}: field 'quantization_config.scale_fmt' is {fmt!r}; use 'float' or 'ue8m0'")
    experts = qc.get("expert_dtype", d.get("expert_dtype", "fp8"))
    if experts not in ("fp8", "fp4"):
        raise ConfigError(f"{where}: field 'quantization_config.expert_dtype' is {experts!r}; use 'fp8' or 'fp4'")
    return (blk[0], blk[1]), fmt, experts


def parse_v4_config(d: dict, source: str = "config.json") -> V4Config:
    """Build a :class:`V4Config` from a parsed config.json, validating what the model relies on."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a JSON object at top level")
    where = source
    if d.get("model_type") not in (None, "deepseek_v4"):
        raise ConfigError(f"{where}: field 'model_type' is {d.get('model_type')!r}; this engine builds 'deepseek_v4'")
    ints = {k: _int(d, k, where) for k in ("vocab_size", "hidden_size", "moe_intermediate_size",
                                           "num_hidden_layers", "num_attention_heads", "head_dim", "q_lora_rank",
                                           "n_routed_experts", "num_experts_per_tok")}
    n = ints["num_hidden_layers"]
    head_dim = ints["head_dim"]
    if d.get("partial_rotary_factor") is not None:
        rope_dim = int(head_dim * _float(d, "partial_rotary_factor", where))
    else:
        rope_dim = _int(d, "qk_rope_head_dim", where, 64)
    if rope_dim % 2 or not 0 < rope_dim <= head_dim:
        raise ConfigError(f"{where}: field 'partial_rotary_factor' gives a rope dim of {rope_dim}; it must be even "
                          f"and within head_dim {head_dim}")
    heads = ints["num_attention_heads"]
    o_groups = _int(d, "o_groups", where, 8)
    if heads % o_groups:
        raise ConfigError(f"{where}: field 'o_groups' ({o_groups}) must divide 'num_attention_heads' ({heads})")
    index_head_dim = _int(d, "index_head_dim", where, 128)
    if index_head_dim < rope_dim:
        raise ConfigError(f"{where}: field 'index_head_dim' ({index_head_dim}) is below the rope dim {rope_dim}")
    if ints["num_experts_per_tok"] > ints["n_routed_experts"]:
        raise ConfigError(f"{where}: field 'num_experts_per_tok' ({ints['num_experts_per_tok']}) exceeds "
                          f"'n_routed_experts' ({ints['n_routed_experts']})")
    scoring = d.get("scoring_func", "sqrtsoftplus")
    if scoring not in SCORING:
        raise ConfigError(f"{where}: field 'scoring_func' is {scoring!r}; choose one of {SCORING}")
    if d.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: field 'hidden_act' is {d.get('hidden_act')!r}; only 'silu' is supported")
    rope_theta = d.get("rope_theta")
    rp = d.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("main"), dict):
        rope_theta = rp["main"].get("rope_theta", rope_theta)
    theta = _float({"rope_theta": rope_theta}, "rope_theta", where, 10000.0)
    compress_theta = _float(d, "compress_rope_theta", where, 160000.0)
    if isinstance(rp, dict) and isinstance(rp.get("compress"), dict):
        compress_theta = _float(rp["compress"], "rope_theta", f"{where} (rope_parameters.compress)", compress_theta)
    fp8_block, scale_fmt, expert_dtype = _quant(d, where)
    return V4Config(
        **ints,
        qk_rope_head_dim=rope_dim,
        n_shared_experts=_int(d, "n_shared_experts", where, 1, minimum=0),
        layer_types=_layer_types(d, n, where),
        mlp_layer_types=_mlp_types(d, n, where),
        compress_rates=_compress_rates(d, where),
        sliding_window=_int(d, "sliding_window", where, 128),
        o_groups=o_groups,
        o_lora_rank=_int(d, "o_lora_rank", where, 1024),
        index_n_heads=_int(d, "index_n_heads", where, 64),
        index_head_dim=index_head_dim,
        index_topk=_int(d, "index_topk", where, 512),
        hc_mult=_int(d, "hc_mult", where, 4),
        hc_sinkhorn_iters=_int(d, "hc_sinkhorn_iters", where, 20),
        hc_eps=_float(d, "hc_eps", where, 1e-6),
        scoring_func=scoring,
        routed_scaling_factor=_float(d, "routed_scaling_factor", where, 1.5),
        swiglu_limit=_float(d, "swiglu_limit", where, 10.0),
        rope_theta=theta,
        compress_rope_theta=compress_theta,
        rms_norm_eps=_float(d, "rms_norm_eps", where, 1e-6),
        max_position_embeddings=_int(d, "max_position_embeddings", where, 4096),
        yarn=_yarn(d, where),
        fp8_block=fp8_block,
        scale_fmt=scale_fmt,
        expert_dtype=expert_dtype,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        extra=d,
    )


def load_v4_config(model_dir: str | Path) -> V4Config:
    return parse_v4_config(*read_config_json(model_dir))
