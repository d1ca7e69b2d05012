"""DeepSeek's release layout of V4 checkpoints (``layers.3.attn.wq_a.weight``, ``embed.weight``, per-expert
``ffn.experts.7.w1.weight``) read under HF's names (``model.layers.3.self_attn.q_a_proj.weight``, experts
stacked as ``mlp.experts.gate_up_proj``), so :mod:`engine.v4.loader` loads either layout. The renames are
those HF's loader applies to ``deepseek_v4`` checkpoints."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from engine.loader import _Reader

# (pattern, replacement), applied in order to every non-expert name
_RENAMES = [
    (r"\.attn\.", ".self_attn."), (r"\.ffn\.", ".mlp."), (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"^embed\.weight$", "embed_tokens.weight"), (r"^head\.weight$", "lm_head.weight"),
    (r"^hc_head_fn$", "hc_head.hc_fn"), (r"^hc_head_base$", "hc_head.hc_base"), (r"^hc_head_scale$", "hc_head.hc_scale"),
    (r"\.attn_norm\.", ".input_layernorm."), (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_attn_(fn|base|scale)$", r".attn_hc.\1"), (r"\.hc_ffn_(fn|base|scale)$", r".ffn_hc.\1"),
    (r"\.attn_sink$", ".sinks"), (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."), (r"\.norm\.", ".kv_norm."), (r"\.ape$", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."), (r"\.self_attn\.wq_b\.", ".self_attn.q_b_proj."), (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."), (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."), (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    (r"\.shared_experts\.w1\.", ".shared_experts.gate_proj."), (r"\.shared_experts\.w2\.", ".shared_experts.down_proj."),
    (r"\.shared_experts\.w3\.", ".shared_experts.up_proj."),
]
_EXPERT = re.compile(r"^(layers\.\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight(_scale_inv)?$")


def is_release_layout(index: dict[str, Path]) -> bool:
    return "embed.weight" in index or any(n.startswith("layers.") for n in index)


def hf_name(name: str) -> str:
    """The HF name of a release-layout tensor (experts aside)."""
    for pat, rep in _RENAMES:
        name = re.sub(pat, rep, name)
    return name if name == "lm_head.weight" else "model." + name


class ReleaseReader(_Reader):
    """:class:`engine.loader._Reader` over a release-layout index, answering to HF names: per-expert
    ``w1``/``w3`` rows are stacked and concatenated into ``gate_up_proj`` (gate first), ``w2`` into
    ``down_proj`` (with their ``_scale_inv`` companions alike)."""

    def __init__(self, index: dict[str, Path]):
        super().__init__(index)
        self.single: dict[str, str] = {}
        self.stacked: dict[str, list[list[str]]] = {}  # HF name -> groups of per-expert names, cat on dim 1
        experts: dict[tuple[str, str, str], dict[int, str]] = {}
        for name in index:
            m = _EXPERT.match(name)
            if m:
                experts.setdefault((m.group(1), m.group(3), m.group(4) or ""), {})[int(m.group(2))] = name
            elif not name.startswith("mtp."):
                self.single[hf_name(name)] = name
        for (layer, w, suffix), by_e in sorted(experts.items()):
            part = "down_proj" if w == "w2" else "gate_up_proj"
            groups = self.stacked.setdefault(f"model.{layer}.mlp.experts.{part}{suffix}",
                                             [[], []] if part == "gate_up_proj" else [[]])
            groups[1 if w == "w3" else 0] = [by_e[e] for e in sorted(by_e)]
        self.raw = index
        self.index = {hf: index[src] for hf, src in self.single.items()}
        self.index.update({hf: index[g[0][0]] for hf, g in self.stacked.items() if g[0]})

    def get(self, name: str) -> torch.Tensor:
        self.used.add(name)
        if name in self.single:
            return self._read_raw(self.single[name])
        return torch.cat([torch.stack([self._read_raw(n) for n in g]) for g in self.stacked[name] if g], dim=1)

    def _read_raw(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self.raw[name]
        f = self._open.get(path)
        if f is None:
            f = self._open[path] = safe_open(str(path), framework="pt")
        return f.get_tensor(name)  # type: ignore[attr-defined]
