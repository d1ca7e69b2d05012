"""KV caches: where attention keeps its keys and values, and how it reads them back.

:class:`~engine.model.MLA` computes the projections and asks its layer's cache to ``write`` this step's
rows and to ``attend`` to everything visible; the cache decides the storage and which op reads it. So the
model's forward is the decode path whichever cache is installed, and a decoder is only a cache, an
:class:`~engine.ops.OpSet` and (on CUDA) a captured graph.

The protocol (what :class:`~engine.model.MLA` relies on):

- ``latent: bool``: ``False`` for per-head K/V rows (the naive layout: ``write(pos, k, v)`` with
  ``k[B, S, heads, qk_head_dim]``, ``v[B, S, heads, v_head_dim]``; ``attend(q, None, pos, end, scale)``
  takes the full ``q[B, S, heads, qk_head_dim]`` and returns ``o[B, S, heads, v_head_dim]``); ``True``
  for absorbed MLA (``write(pos, latent, k_pe)`` with the normalised latent ``[B, S, C]`` and the rotated
  rope key ``[B, S, R]``; ``attend(q_lat, q_pe, pos, end, scale)`` returns ``o_lat[B, S, heads, C]``).
- ``pos[B, S]`` are absolute positions; a query sees every cached row at a position ``<=`` its own.
- ``end`` is ``pos.max() + 1`` when the caller computed it (a host sync) or ``None``: dense caches
  slice their rows by it (computing it if needed); the paged cache decodes from ``seq_lens`` on the device
  and needs no host value, which is what makes its decode step graph-capturable.

A model-wide :class:`ModelCache` gives each layer its cache and ``begin(pos)``, called once per forward
before layer 0, returns that step's ``end`` (or ``None``) and updates any device-side lengths.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.ops import OpSet
from engine.paged_cache import PagedLatentCache


class LayerCache(Protocol):
    """What one attention layer asks of its cache (see the module docstring)."""

    latent: bool

    def write(self, pos: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None: ...

    def attend(self, q: torch.Tensor, q_pe: torch.Tensor | None, pos: torch.Tensor, end: int | None,
               scale: float) -> torch.Tensor: ...


def _end(pos: torch.Tensor, end: int | None) -> int:
    return int(pos.max()) + 1 if end is None else end


def _visible(pos: torch.Tensor, end: int) -> torch.Tensor:
    """``[B, S, 1, T]``: query ``(b, s)`` sees cached position ``t`` iff ``t <= pos[b, s]``."""
    return (torch.arange(end, device=pos.device).view(1, 1, end) <= pos.unsqueeze(-1)).unsqueeze(2)


def _rows(pos: torch.Tensor) -> torch.Tensor:
    b, s = pos.shape
    return torch.arange(b, device=pos.device).unsqueeze(1).expand(b, s)


def joined(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``cat([a, b], -1)`` in ``a.dtype``; a view, not a copy, when ``b`` follows ``a`` in the rows of one buffer
    (the model writes the latent query and its rope part side by side)."""
    if (a.dtype == b.dtype and a.shape[:-1] == b.shape[:-1] and a.stride() == b.stride() and a.stride(-1) == 1
            and b.data_ptr() == a.data_ptr() + a.shape[-1] * a.element_size()
            and a.stride(-2) >= a.shape[-1] + b.shape[-1]):
        return a.as_strided((*a.shape[:-1], a.shape[-1] + b.shape[-1]), a.stride())
    return torch.cat([a, b.to(a.dtype)], dim=-1)


def latent_attention(q_lat: torch.Tensor, q_pe: torch.Tensor, kv: torch.Tensor, pe: torch.Tensor,
                     pos: torch.Tensor, scale: float) -> torch.Tensor:
    """Absorbed attention of many queries over ``kv[B, T, C]``/``pe[B, T, R]`` (prefill, torch): scores in
    fp32, softmax, then the latent rows weighted; rows a query cannot see get probability zero."""
    end = kv.shape[1]
    scores = (torch.einsum("bshc,btc->bsht", q_lat, kv)
              + torch.einsum("bshr,btr->bsht", q_pe, pe)).float() * scale
    p = scores.masked_fill(~_visible(pos, end), float("-inf")).softmax(dim=-1).to(q_lat.dtype)
    return torch.einsum("bsht,btc->bshc", p, kv)


class DenseNaiveCache:
    """Per-head K and V, ``[B, T, heads, dim]``: what HF caches, and the oracle for the absorbed layouts."""

    latent = False

    def __init__(self, batch: int, max_len: int, heads: int, qk_head_dim: int, v_head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.k = torch.zeros(batch, max_len, heads, qk_head_dim, dtype=dtype, device=device)
        self.v = torch.zeros(batch, max_len, heads, v_head_dim, dtype=dtype, device=device)

    def write(self, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        rows = _rows(pos)
        self.k[rows, pos] = k.to(self.k.dtype)
        self.v[rows, pos] = v.to(self.v.dtype)

    def attend(self, q: torch.Tensor, q_pe: torch.Tensor | None, pos: torch.Tensor, end: int | None,
               scale: float) -> torch.Tensor:
        end = _end(pos, end)
        scores = torch.einsum("bshd,bthd->bsht", q, self.k[:, :end]).float() * scale
        p = scores.masked_fill(~_visible(pos, end), float("-inf")).softmax(dim=-1).to(q.dtype)
        return torch.einsum("bsht,bthd->bshd", p, self.v[:, :end])


class DenseLatentCache:
    """Absorbed MLA over one contiguous row per sequence: ``kv[B, T, C]`` and ``pe[B, T, R]``. Decode goes
    through the op set's ``mla_decode``; a prompt attends in torch over the rows so far."""

    latent = True

    def __init__(self, batch: int, max_len: int, kv_lora_rank: int, rope_dim: int, ops: OpSet,
                 dtype: torch.dtype, device: torch.device | str):
        self.kv = torch.zeros(batch, max_len, kv_lora_rank, dtype=dtype, device=device)
        self.pe = torch.zeros(batch, max_len, rope_dim, dtype=dtype, device=device)
        self.ops = ops

    def write(self, pos: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor) -> None:
        rows = _rows(pos)
        self.kv[rows, pos] = latent.to(self.kv.dtype)
        self.pe[rows, pos] = k_pe.to(self.pe.dtype)

    def attend(self, q_lat: torch.Tensor, q_pe: torch.Tensor, pos: torch.Tensor, end: int | None,
               scale: float) -> torch.Tensor:
        end = _end(pos, end)
        kv, pe = self.kv[:, :end], self.pe[:, :end]
        if pos.shape[1] == 1:
            o, _ = self.ops.mla_decode(q_lat[:, 0], q_pe[:, 0], kv, pe, pos[:, 0] + 1, scale)
            return o.unsqueeze(1)
        return latent_attention(q_lat, q_pe, kv, pe, pos, scale)


class PagedLayerCache:
    """One layer's view of a :class:`~engine.paged_cache.PagedLatentCache`. Decode reads pages through the
    block table with the op set's ``paged_mla_decode`` and never needs ``end``; a prompt gathers its rows
    back from the pages and attends in torch."""

    latent = True

    def __init__(self, pool: PagedLatentCache, layer: int, ops: OpSet):
        self.pool, self.index, self.ops = pool, layer, ops

    def write(self, pos: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor) -> None:
        pool = self.pool
        self.ops.paged_kv_write(pool.layer(self.index), pool.block_table, pos, latent, k_pe)

    def attend(self, q_lat: torch.Tensor, q_pe: torch.Tensor, pos: torch.Tensor, end: int | None,
               scale: float) -> torch.Tensor:
        pool, b = self.pool, pos.shape[0]
        c = pool.kv_lora_rank
        if pos.shape[1] == 1:
            q = joined(q_lat[:, 0], q_pe[:, 0])
            o, _ = self.ops.paged_mla_decode(q, pool.layer(self.index), pool.block_table[:b], pool.seq_lens[:b],
                                             scale, c)
            return o.unsqueeze(1)
        end = _end(pos, end)
        rows = pool.gather(self.index, b, end)  # [B, end, C + R]; NaN where nothing was written
        seen = (torch.arange(end, device=pos.device).view(1, end) <= pos.max(dim=1).values.unsqueeze(1))
        rows = torch.where(seen.unsqueeze(-1), rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
        rows = rows.to(q_lat.dtype)
        return latent_attention(q_lat, q_pe.to(q_lat.dtype), rows[..., :c], rows[..., c:], pos, scale)


class ModelCache:
    """Every layer's cache, and the once-per-forward hook: ``begin(pos)`` returns the step's ``end`` for dense
    caches, and for the paged one records ``seq_lens = pos[:, -1] + 1`` on the device instead (no sync).
    A ``static`` dense cache attends over all ``max_len`` rows (masked by position, as gpt-fast does): no
    host sync and one shape for every step, which is what ``torch.compile`` and graph capture want."""

    def __init__(self, layers: list[LayerCache], pool: PagedLatentCache | None = None, static_len: int | None = None):
        self.layers, self.pool, self.static_len = layers, pool, static_len

    def begin(self, pos: torch.Tensor) -> int | None:
        if self.static_len is not None:
            return self.static_len
        if self.pool is None:
            return int(pos.max()) + 1
        self.pool.seq_lens[: pos.shape[0]].copy_(pos[:, -1] + 1)
        return None if pos.shape[1] == 1 else int(pos.max()) + 1


def dense_cache(cfg, heads: int, batch: int, max_len: int, layout: str, n_layers: int, ops: OpSet,
                dtype: torch.dtype, device, static: bool = False) -> ModelCache:
    """Contiguous caches for ``n_layers`` attention layers, ``layout`` ``"naive"`` or ``"absorbed"``;
    ``static``: every step attends over all ``max_len`` rows (see :class:`ModelCache`)."""
    if layout == "naive":
        layers = [DenseNaiveCache(batch, max_len, heads, cfg.qk_head_dim, cfg.v_head_dim, dtype, device)
                  for _ in range(n_layers)]
    elif layout == "absorbed":
        layers = [DenseLatentCache(batch, max_len, cfg.kv_lora_rank, cfg.qk_rope_head_dim, ops, dtype, device)
                  for _ in range(n_layers)]
    else:
        raise ValueError(f"mla mode must be one of ('naive', 'absorbed'), got {layout!r}")
    return ModelCache(layers, static_len=max_len if static else None)


def paged_cache(pool: PagedLatentCache, ops: OpSet) -> ModelCache:
    """One :class:`PagedLayerCache` per layer of ``pool``."""
    return ModelCache([PagedLayerCache(pool, i, ops) for i in range(pool.pages.shape[0])], pool)
