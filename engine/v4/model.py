"""DeepSeek-V4-family transformer: hyper-connected residual streams around attention (sliding, CSA, HCA)
and MoE (hash-routed or top-k) blocks.

The forward is the decode path: every call reads and extends the layers' cache objects
(:mod:`engine.v4.cache`), whether it carries a whole prompt or one token per sequence; there is no
separate prefill model. Parameter names follow HF's ``DeepseekV4ForCausalLM``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.v4.attention import Attention
from engine.v4.cache import CompressorCache, KVPool, LayerCache, WindowCache
from engine.v4.compressor import Step
from engine.v4.config import CSA, SLIDING, V4Config
from engine.v4.hyper import HyperConnection, HyperHead
from engine.v4.layers import Linear, RMSNorm, rope_rot, rope_tables
from engine.v4.moe import MoE
from engine.v4.ops import V4Ops


class DecoderLayer(nn.Module):
    def __init__(self, cfg: V4Config, i: int, ops: V4Ops, dtype: torch.dtype | None):
        super().__init__()
        self.self_attn = Attention(cfg, cfg.layer_types[i], ops, dtype)
        self.mlp = MoE(cfg, cfg.mlp_layer_types[i], ops, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.attn_hc = HyperConnection(cfg, ops)
        self.ffn_hc = HyperConnection(cfg, ops)

    def forward(self, streams: torch.Tensor, step: Step, cache: LayerCache) -> torch.Tensor:
        x, post, comb = self.attn_hc.pre(streams)
        streams = self.attn_hc.post(self.self_attn(self.input_layernorm(x), step, cache), streams, post, comb)
        x, post, comb = self.ffn_hc.pre(streams)
        return self.ffn_hc.post(self.mlp(self.post_attention_layernorm(x), step), streams, post, comb)


class Body(nn.Module):
    def __init__(self, cfg: V4Config, ops: V4Ops, dtype: torch.dtype | None):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, ops, dtype) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.hc_head = HyperHead(cfg, ops)


class DeepseekV4(nn.Module):
    def __init__(self, cfg: V4Config, *, dtype: torch.dtype | None = None, backend: str | dict[str, str] = "torch",
                 max_positions: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.ops = V4Ops(backend)
        self.model = Body(cfg, self.ops, dtype)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, dtype)
        self.max_positions = max_positions or cfg.max_position_embeddings
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.rot: dict[str, torch.Tensor] = {}  # cos + i·sin per kind, what the blocks rotate by
        self.caches: list[LayerCache] = []

    def init_rope(self, device) -> None:
        """The fp32 rope tables (``main`` and ``compress``) on ``device`` (made lazily: a model built on the
        meta device has none until it is materialised)."""
        with torch.device("cpu"):
            tabs = {k: rope_tables(self.cfg, k, self.max_positions) for k in ("main", "compress")}
        self.tables = {k: (cos.to(device), sin.to(device)) for k, (cos, sin) in tabs.items()}
        self.rot = {k: rope_rot(cos, sin) for k, (cos, sin) in self.tables.items()}

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def setup_cache(self, batch: int, max_len: int, kv: str = "dense") -> None:
        """Fresh caches for ``batch`` sequences of up to ``max_len`` tokens. ``kv="fp8"`` also packs every key
        into a 584-byte FP8 pool per layer that decode steps attend over (needs V4's 448 + 64 head)."""
        c = self.cfg
        if max_len > self.max_positions:
            raise ValueError(f"max_len {max_len} exceeds the {self.max_positions} rope positions of this model")
        if kv not in ("dense", "fp8"):
            raise ValueError(f"kv must be 'dense' or 'fp8', got {kv!r}")
        if kv == "fp8" and (c.head_dim, c.qk_rope_head_dim) != (512, 64):
            raise ValueError(f"kv='fp8' stores 448 nope + 64 rope channels per token; this config has head_dim "
                             f"{c.head_dim} with {c.qk_rope_head_dim} rope channels")
        dt, dev = self.model.embed_tokens.weight.dtype, self.device
        self.caches = []
        for t in c.layer_types:
            rate = c.compress_rates.get(t, 0)
            n_entries = max_len // rate + 1 if rate else 0
            pool = KVPool(batch, c.sliding_window, n_entries, self.ops.kv_pack, dev) if kv == "fp8" else None
            window = WindowCache(batch, c.sliding_window, c.head_dim, dt, dev, pool)
            comp = idx = None
            if t != SLIDING:
                comp = CompressorCache(batch, rate, t == CSA, c.head_dim * (2 if t == CSA else 1), c.head_dim,
                                       max_len, dt, dev, pool)
                if t == CSA:
                    idx = CompressorCache(batch, rate, True, 2 * c.index_head_dim, c.index_head_dim, max_len, dt, dev)
            self.caches.append(LayerCache(window, comp, idx, pool))

    def hidden(self, tokens: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None = None,
               routes: list | None = None) -> torch.Tensor:
        """Final-norm hidden states ``[B, S, H]`` of ``tokens[B, S]`` at positions ``pos[b, s] = start_b + s``,
        reading and extending the caches; tokens where ``valid`` is False (padding) are never cached."""
        if not self.caches:
            raise RuntimeError("call setup_cache(batch, max_len) before the first forward")
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        if not self.tables or self.tables["main"][0].device != tokens.device:
            self.init_rope(tokens.device)
        rope = {k: rot[pos] for k, rot in self.rot.items()}
        step = Step(tokens=tokens, pos=pos, valid=valid, rope=rope, tables=self.rot, routes=routes)
        x = self.model.embed_tokens(tokens)
        streams = x.unsqueeze(2).expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        for layer, cache in zip(self.model.layers, self.caches, strict=True):
            streams = layer(streams, step, cache)
        return self.model.norm(self.model.hc_head(streams))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits: a bf16 head would turn close scores into exact ties and greedy decoding into a coin toss."""
        w = getattr(self, "_lm_head_fp32", None)
        if w is None or w.device != h.device:
            w = self._lm_head_fp32 = self.lm_head.dense_weight(torch.float32)
        return F.linear(h.float(), w)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None = None,
                last: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, V]`` at column ``last[b]`` of each row (default: the last column)."""
        h = self.hidden(tokens, pos, valid)
        if last is None:
            return self.logits(h[:, -1])
        return self.logits(h[torch.arange(h.shape[0], device=h.device), last])

    def set_qat(self, on: bool = True) -> None:
        """QAT-faithful linears and experts, as trained: fp8 weights multiply block-quantised fp8 activations
        (w8a8), MXFP4 experts too (w4a8: ``kernels.mxfp4.mxfp4_moe_w4a8``, where the part has fp8 MMA)."""
        for m in self.modules():
            if isinstance(m, (Linear, MoE)):
                m.qat = on

