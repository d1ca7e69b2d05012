"""The compressors of CSA and HCA layers, and the lightning indexer that picks CSA's entries.

A compressor turns every ``rate`` source tokens into one key: a softmax-gated sum of their projections
(per channel, with a learned bias per slot), RMS-normalised, rotated at the window's first position with
the compress rope. CSA (rate 4) overlaps windows: entry ``w`` mixes the first half of window ``w-1``'s
projections with the second half of window ``w``'s, over ``2·rate`` slots. HCA (rate 128) does not.
Entries exist only once their window is complete, so a query at position ``p`` sees ``(p+1) // rate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.v4.cache import CompressorCache
from engine.v4.config import CSA, V4Config
from engine.v4.layers import Linear, RMSNorm, param, rope_tail_
from engine.v4.ops import V4Ops


@dataclass
class Step:
    """What every block of one forward call shares: positions, validity, tokens and rope rows."""

    tokens: torch.Tensor  # [B, S]
    pos: torch.Tensor  # [B, S]
    valid: torch.Tensor  # [B, S] bool
    rope: dict[str, torch.Tensor]  # kind -> cos + i·sin [B, S, r/2] at pos (complex64)
    tables: dict[str, torch.Tensor]  # kind -> the full cos + i·sin table [max_pos, r/2]
    routes: list | None = None  # when a list, MoE layers append their chosen experts
    memo: dict = field(default_factory=dict)  # what every layer of this forward computes alike, made once

    def once(self, key: tuple, make: Callable[[], object]):
        """``make()`` the first time a layer asks for ``key`` in this forward, the same tensors after: every
        layer's caches hold the same positions (one window size, one ring per compression rate), so masks,
        slots and window indices are shared instead of recomputed layer by layer (fewer kernels per step)."""
        v = self.memo.get(key)
        if v is None:
            v = self.memo[key] = make()
        return v


class _Pool(nn.Module):
    """The gated pooling shared by the compressors and the indexer's key compressor."""

    def __init__(self, cfg: V4Config, rate: int, dim: int, overlap: bool, dtype: torch.dtype | None,
                 ops: V4Ops | None = None):
        super().__init__()
        proj = dim * (2 if overlap else 1)
        self.kv_proj = Linear(cfg.hidden_size, proj, dtype)
        self.gate_proj = Linear(cfg.hidden_size, proj, dtype)
        self.position_bias = param(rate, proj, dtype=torch.float32)
        self.kv_norm = RMSNorm(dim, cfg.rms_norm_eps, ops)
        self.rate, self.dim, self.overlap = rate, dim, overlap

    def pool(self, x: torch.Tensor, step: Step, cache: CompressorCache,
             proj: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Emit the entries this chunk completes into ``cache``; returns every entry slot ``[B, E, dim]``
        (the cache's capacity: slots not yet emitted are masked by the readers, by position). ``proj``: this
        chunk's ``(kv_proj(x), gate_proj(x))`` when the caller made them (in one GEMM with its own)."""
        kvp, gp = proj if proj is not None else (self.kv_proj(x), self.gate_proj(x))
        rows, ids, kv, gate, ok, done = cache.windows(kvp, gp, step.pos, step.valid, step.once)
        m, d = self.rate, self.dim
        if self.overlap:  # previous window's first half, then this window's second half
            kv = torch.cat([kv[:, :m, :d], kv[:, m:, d:]], dim=1)
            gate = torch.cat([gate[:, :m, :d], gate[:, m:, d:]], dim=1) + self._slot_bias()
        else:
            gate = gate + self.position_bias
        # a candidate that completes nothing may have no valid source at all: it is pooled (to NaN) and
        # stored in the cache's trash slot, so nothing waits on the host to filter it out. A missing source
        # gets weight exp(-inf) = 0, and its kv (a finite projection, or the ring's zeros) then adds 0.
        key = ("pool", m, cache.ring)  # every cache of this rate and ring holds the same positions
        miss = step.once(key + ("miss",), lambda: ~ok.unsqueeze(-1))
        gate = gate.masked_fill(miss, float("-inf"))
        # the softmax over the window's slots (dim 1) written out: torch's softmax over a non-last dim is one
        # slow kernel on CUDA, and a decode step runs five of them
        e = (gate - gate.amax(dim=1, keepdim=True)).exp()
        pooled = (kv * (e / e.sum(dim=1, keepdim=True)).to(kv.dtype)).sum(dim=1)
        rot = step.tables["compress"]
        at = step.once(key + ("rot",), lambda: rot[(ids * m).clamp(max=rot.shape[0] - 1)])
        entries = rope_tail_(self.kv_norm(pooled), at)  # a fresh tensor: rotated in place
        cache.store(rows, ids, entries, done, step.once)
        return cache.entries


    def _slot_bias(self) -> torch.Tensor:
        """The overlapping window's slot bias ``[2·rate, dim]``: the first half's channels of the previous
        window's slots, then the second half's (made once from ``position_bias``, not per step)."""
        b, d = self.position_bias, self.dim
        c = self.__dict__.get("_slot_bias_of")
        if c is None or c[0] != (b.data_ptr(), b.device):
            with torch.inference_mode(False), torch.no_grad():
                c = self.__dict__["_slot_bias_of"] = ((b.data_ptr(), b.device), torch.cat([b[:, :d], b[:, d:]], 0))
        return c[1]


class Scorer(nn.Module):
    def __init__(self, cfg: V4Config, dtype: torch.dtype | None):
        super().__init__()
        self.weights_proj = Linear(cfg.hidden_size, cfg.index_n_heads, dtype)


class Indexer(_Pool):
    """Lightning indexer: its own overlapping key compressor at ``index_head_dim``, query heads from the
    attention's low-rank query, and ``Σ_h w_h · relu(q_h · k)`` scores; the ``index_topk`` best visible
    entries per query are attended."""

    def __init__(self, cfg: V4Config, ops: V4Ops, dtype: torch.dtype | None):
        super().__init__(cfg, cfg.compress_rates[CSA], cfg.index_head_dim, True, dtype, ops)
        self.q_b_proj = Linear(cfg.q_lora_rank, cfg.index_n_heads * cfg.index_head_dim, dtype)
        self.scorer = Scorer(cfg, dtype)
        self.cfg, self.ops = cfg, ops

    def linears(self) -> list[Linear]:
        """The projections of the block input ``x`` this indexer makes (see ``proj`` of :meth:`forward`)."""
        return [self.kv_proj, self.gate_proj, self.scorer.weights_proj]

    def forward(self, x: torch.Tensor, q_lat: torch.Tensor, step: Step, cache: CompressorCache,
                n_visible: torch.Tensor, proj: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Indices ``[B, S, k]`` of the chosen entries, ``-1`` where fewer are visible. ``proj``: the outputs
        of :meth:`linears` on ``x`` when the caller made them."""
        c = self.cfg
        keys = self.pool(x, step, cache, (proj[0], proj[1]) if proj else None)  # every slot; unseen ones: -inf
        b, s, _ = x.shape
        q = self.q_b_proj(q_lat).view(b, s, c.index_n_heads, c.index_head_dim)
        q = rope_tail_(q, step.rope["compress"].unsqueeze(2))
        w = (proj[2] if proj else self.scorer.weights_proj(x)).float() * c.index_n_heads ** -0.5
        return self.ops.indexer_topk(q, w, keys, n_visible, c.index_head_dim ** -0.5, c.index_topk)


class Compressor(_Pool):
    """The CSA (overlapping, with an indexer) or HCA compressor of one attention layer."""

    def __init__(self, cfg: V4Config, layer_type: str, ops: V4Ops, dtype: torch.dtype | None):
        csa = layer_type == CSA
        super().__init__(cfg, cfg.compress_rates[layer_type], cfg.head_dim, csa, dtype, ops)
        self.indexer = Indexer(cfg, ops, dtype) if csa else None

    def linears(self) -> list[Linear]:
        """The projections of the block input ``x`` this compressor makes (``proj`` of :meth:`forward`)."""
        return [self.kv_proj, self.gate_proj]

    def forward(self, x: torch.Tensor, step: Step, cache: CompressorCache,
                proj: list[torch.Tensor] | None = None) -> torch.Tensor:
        return self.pool(x, step, cache, (proj[0], proj[1]) if proj else None)
