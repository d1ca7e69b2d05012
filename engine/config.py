"""DeepSeek-V3 model config, read from a Hugging Face ``config.json``.

Both spellings of YaRN settings are accepted: the classic ``rope_theta`` + ``rope_scaling`` pair and the
``rope_parameters`` dict newer transformers write. Every problem is reported as a :class:`ConfigError`
that names the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config.json that cannot describe a model we can build."""


@dataclass(frozen=True)
class Yarn:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int = 4096
    num_nextn_predict_layers: int = 0
    yarn: Yarn | None = None
    fp8_block: tuple[int, int] | None = None  # quantization_config.weight_block_size of an FP8 checkpoint
    tie_word_embeddings: bool = False
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, i: int) -> bool:
        return self.n_routed_experts > 0 and i >= self.first_k_dense_replace


_REQUIRED_INT = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "n_routed_experts", "num_experts_per_tok",
)


def _int(d: dict, key: str, where: str, default=None, *, minimum: int = 1) -> int:
    if key not in d or d[key] is None:
        if default is None:
            raise ConfigError(f"{where}: missing required field '{key}'")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}: field '{key}' must be an integer, got {v!r}")
    if v < minimum:
        raise ConfigError(f"{where}: field '{key}' must be >= {minimum}, got {v}")
    return v


def _float(d: dict, key: str, where: str, default=None) -> float:
    if key not in d or d[key] is None:
        if default is None:
            raise ConfigError(f"{where}: missing required field '{key}'")
        return float(default)
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{where}: field '{key}' must be a number, got {v!r}")
    return float(v)


def _rope(d: dict, where: str) -> tuple[float, Yarn | None]:
    params = d.get("rope_parameters")
    scaling = d.get("rope_scaling")
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"{where}: field 'rope_parameters' must be an object, got {params!r}")
    if scaling is not None and not isinstance(scaling, dict):
        raise ConfigError(f"{where}: field 'rope_scaling' must be an object or null, got {scaling!r}")
    src = params or scaling or {}
    theta_src = params if params and "rope_theta" in params else d
    theta = _float(theta_src, "rope_theta", where, default=10000.0)
    kind = src.get("rope_type", src.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    name = "rope_parameters" if params else "rope_scaling"
    if kind != "yarn":
        raise ConfigError(f"{where}: field '{name}.rope_type' is {kind!r}; only 'yarn' or 'default' are supported")
    sub = f"{where} ({name})"
    yarn = Yarn(
        factor=_float(src, "factor", sub),
        original_max_position_embeddings=_int(src, "original_max_position_embeddings", sub),
        beta_fast=_float(src, "beta_fast", sub, 32.0),
        beta_slow=_float(src, "beta_slow", sub, 1.0),
        mscale=_float(src, "mscale", sub, 1.0),
        mscale_all_dim=_float(src, "mscale_all_dim", sub, 0.0),
    )
    return theta, yarn


def parse_config(d: dict, source: str = "config.json") -> ModelConfig:
    """Build a :class:`ModelConfig` from a parsed config.json, validating what the model relies on."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a JSON object at top level")
    where = source
    mt = d.get("model_type")
    if mt is not None and mt not in ("deepseek_v3", "deepseek_v2", "kimi_k2"):
        raise ConfigError(f"{where}: field 'model_type' is {mt!r}; this engine builds 'deepseek_v3' models")
    ints = {k: _int(d, k, where) for k in _REQUIRED_INT}
    q_lora = d.get("q_lora_rank")
    if q_lora is not None:
        q_lora = _int(d, "q_lora_rank", where)
    n_group = _int(d, "n_group", where, 1)
    topk_group = _int(d, "topk_group", where, 1)
    n_exp = ints["n_routed_experts"]
    if n_exp % n_group:
        raise ConfigError(f"{where}: field 'n_group' ({n_group}) must divide 'n_routed_experts' ({n_exp})")
    if topk_group > n_group:
        raise ConfigError(f"{where}: field 'topk_group' ({topk_group}) exceeds 'n_group' ({n_group})")
    if n_group > 1 and n_exp // n_group < 2:
        raise ConfigError(f"{where}: field 'n_group' ({n_group}) leaves fewer than 2 experts per group")
    if ints["num_experts_per_tok"] > topk_group * (n_exp // n_group):
        raise ConfigError(
            f"{where}: field 'num_experts_per_tok' ({ints['num_experts_per_tok']}) exceeds the experts of "
            f"the {topk_group} kept groups ({topk_group * (n_exp // n_group)})"
        )
    if ints["qk_rope_head_dim"] % 2:
        raise ConfigError(f"{where}: field 'qk_rope_head_dim' must be even, got {ints['qk_rope_head_dim']}")
    scoring = d.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise ConfigError(f"{where}: field 'scoring_func' is {scoring!r}; the noaux_tc gate needs 'sigmoid'")
    topk_method = d.get("topk_method", "noaux_tc")
    if topk_method != "noaux_tc":
        raise ConfigError(f"{where}: field 'topk_method' is {topk_method!r}; only 'noaux_tc' is supported")
    theta, yarn = _rope(d, where)
    fp8_block = None
    qc = d.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise ConfigError(f"{where}: field 'quantization_config' must be an object")
        if qc.get("quant_method") not in (None, "fp8"):
            raise ConfigError(f"{where}: field 'quantization_config.quant_method' is {qc.get('quant_method')!r}; "
                              "only 'fp8' is supported")
        if qc.get("fmt", "e4m3") != "e4m3":
            raise ConfigError(f"{where}: field 'quantization_config.fmt' is {qc.get('fmt')!r}; only 'e4m3' is supported")
        blk = qc.get("weight_block_size", [128, 128])
        if not (isinstance(blk, list) and len(blk) == 2 and all(isinstance(b, int) and b > 0 for b in blk)):
            raise ConfigError(f"{where}: field 'quantization_config.weight_block_size' must be [rows, cols], got {blk!r}")
        fp8_block = (blk[0], blk[1])
    return ModelConfig(
        **ints,
        q_lora_rank=q_lora,
        n_shared_experts=_int(d, "n_shared_experts", where, 0, minimum=0),
        n_group=n_group,
        topk_group=topk_group,
        first_k_dense_replace=_int(d, "first_k_dense_replace", where, 0, minimum=0),
        routed_scaling_factor=_float(d, "routed_scaling_factor", where, 1.0),
        norm_topk_prob=bool(d.get("norm_topk_prob", True)),
        rope_theta=theta,
        rms_norm_eps=_float(d, "rms_norm_eps", where, 1e-6),
        max_position_embeddings=_int(d, "max_position_embeddings", where, 4096),
        num_nextn_predict_layers=_int(d, "num_nextn_predict_layers", where, 0, minimum=0),
        yarn=yarn,
        fp8_block=fp8_block,
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        extra=d,
    )


def read_config_json(model_dir: str | Path) -> tuple[Any, str]:
    """``config.json``'s parsed JSON and its path; both model families read it through here."""
    path = Path(model_dir) / "config.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found (a model directory needs config.json)") from None
    try:
        return json.loads(text), str(path)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None


def load_config(model_dir: str | Path) -> ModelConfig:
    return parse_config(*read_config_json(model_dir))
