"""V4 attention: one shared key/value head (MQA), partial interleaved rope, a learnable sink per head, a
sliding window on every layer, compressed keys on CSA/HCA layers, and the grouped output projection.

The key is also the value, so the value carries the key's rope; the output's rope channels are rotated
back by the query's position before the heads are mixed. The attention reads its keys from the layer's
cache objects only: the window (this chunk's keys enter it), the compressor's entries and, on CSA
layers, the indexer's choice among them.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.v4.cache import LayerCache
from engine.v4.compressor import Compressor, Step
from engine.v4.config import SLIDING, V4Config
from engine.v4.layers import Linear, RMSNorm, linears_on, param, rope_tail_, unit_rmsnorm
from engine.v4.ops import V4Ops


class Attention(nn.Module):
    def __init__(self, cfg: V4Config, layer_type: str, ops: V4Ops, dtype: torch.dtype | None):
        super().__init__()
        h, nh, d = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
        self.q_a_proj = Linear(h, cfg.q_lora_rank, dtype)
        self.q_a_norm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, ops)
        self.q_b_proj = Linear(cfg.q_lora_rank, nh * d, dtype)
        self.kv_proj = Linear(h, d, dtype)
        self.kv_norm = RMSNorm(d, cfg.rms_norm_eps, ops)
        self.o_a_proj = Linear(nh * d // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, dtype)
        self.o_b_proj = Linear(cfg.o_groups * cfg.o_lora_rank, h, dtype)
        self.sinks = param(nh, dtype=torch.float32)
        self.compressor = Compressor(cfg, layer_type, ops, dtype) if layer_type != SLIDING else None
        self.layer_type = layer_type
        self.rope_kind = "main" if layer_type == SLIDING else "compress"
        self.rate = cfg.compress_rates.get(layer_type, 0)
        self.cfg, self.ops = cfg, ops

    def forward(self, x: torch.Tensor, step: Step, cache: LayerCache) -> torch.Tensor:
        c = self.cfg
        b, s, _ = x.shape
        nh, d = c.num_attention_heads, c.head_dim
        rot = step.rope[self.rope_kind]
        # every projection of x in one GEMM: query, key, and the compressor's and indexer's
        comp = self.compressor
        mods = [self.q_a_proj, self.kv_proj]
        if comp is not None:
            mods += comp.linears() + (comp.indexer.linears() if comp.indexer is not None else [])
        ys = linears_on(x, mods)
        q_lat = self.q_a_norm(ys[0])
        q = unit_rmsnorm(self.q_b_proj(q_lat).view(b, s, nh, d), c.rms_norm_eps)
        q = rope_tail_(q, rot.unsqueeze(2))  # fresh tensors: rotated in place
        kv = rope_tail_(self.kv_norm(ys[1]), rot)

        keys, kpos = cache.window.extend(kv, step.pos, step.valid, step.once)
        chosen = idx = None
        pooled = s == 1 and cache.pool is not None  # decode reads the 584-byte FP8 pool by row index

        def window_mask():
            qp, kp = step.pos.unsqueeze(-1), kpos.unsqueeze(1)
            return (kp >= 0) & (kp <= qp) & (kp > qp - c.sliding_window)  # [B, S, W+S]

        # every layer's window holds the same positions: one mask per forward
        mask = None if pooled else step.once(("window_mask", c.sliding_window), window_mask)
        if self.compressor is not None:
            n_visible = step.once(("n_visible", self.rate), lambda: (step.pos + 1) // self.rate)
            # every entry slot of the cache (a static shape); those past a query's n_visible are masked
            entries = self.compressor(x, step, cache.compressor, ys[2:4])  # [B, E, D]
            e = entries.shape[1]
            if self.compressor.indexer is not None:
                idx = self.compressor.indexer(x, q_lat, step, cache.indexer, n_visible, ys[4:7])
            if idx is not None and not pooled:
                chosen = torch.zeros(b, s, e + 1, dtype=torch.bool, device=x.device)
                chosen.scatter_(-1, torch.where(idx >= 0, idx, e), True)
                chosen = chosen[..., :e]
            elif idx is None:
                chosen = step.once(("all_visible", self.rate, e), lambda: torch.arange(e, device=x.device).view(
                    1, 1, e) < n_visible.unsqueeze(-1))
            if not pooled:
                assert mask is not None and chosen is not None
                keys = torch.cat([keys, entries.to(keys.dtype)], dim=1)
                mask = torch.cat([mask, chosen], dim=-1)
        if pooled:
            assert cache.pool is not None
            # CSA: the indexer's picks (k rows, not one per entry slot); HCA: every entry slot, masked
            sel = chosen[:, 0] if chosen is not None else None
            rows = cache.decode_rows(step.pos[:, 0], sel, idx[:, 0] if idx is not None else None,
                                     step.once).to(torch.int32)
            o = self.ops.sparse_decode(q[:, 0], cache.pool.rows, rows, self.sinks, d ** -0.5).unsqueeze(1)
        else:
            o = self.ops.attention(q, keys, mask, self.sinks, d ** -0.5)  # [B, S, H, D]
        o = rope_tail_(o, step.once(("rot_back", self.rope_kind), lambda: rot.conj().unsqueeze(2)))  # unrotate
        g = c.o_groups
        w = self.o_a_proj.dense_weight(o.dtype).view(g, c.o_lora_rank, -1)
        grouped = torch.einsum("bsgk,grk->bsgr", o.reshape(b, s, g, -1), w)
        return self.o_b_proj(grouped.reshape(b, s, g * c.o_lora_rank))
