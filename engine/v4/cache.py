"""The V4 decode caches: a sliding window of keys and the state of a compressor.

Every layer has a :class:`WindowCache` (its last ``sliding_window`` keys, as a ring indexed by position);
CSA and HCA layers add a :class:`CompressorCache` for their compressed keys, and CSA layers a second one
for the lightning indexer's keys. A compressor cache holds the projections of the source tokens that its
next entries still need (a ring of one window, two for the overlapping CSA windows) and the entries
emitted so far. Rows of a batch advance independently: each call brings positions ``pos[b, s] = start_b + s``
and a ``valid`` mask, and only valid tokens are written, so ragged prompts share one prefill.
"""

from __future__ import annotations

import torch


def _last_writes(pos: torch.Tensor, valid: torch.Tensor, ring: int) -> torch.Tensor:
    """Which valid tokens to write to a ring of ``ring`` slots: the last ``ring`` of each row (no two
    writes then hit one slot)."""
    last = torch.where(valid, pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)
    return valid & (pos > last - ring)


class KVPool:
    """A layer's 584-byte FP8 pool (:mod:`kernels.kv584`): the window's keys in rows ``b·W + slot``, then the
    compressed entries in rows ``B·W + b·E + e``. Decode attends over it by row index."""

    def __init__(self, batch: int, window: int, entries: int, pack, device):
        from kernels.kv584 import new_pool

        self.window, self.entries, self.batch = window, entries, batch
        self.rows = new_pool(batch * (window + entries), 1, device)
        self.pack = pack  # the kv584_store op (torch reference or Triton)

    def write(self, rows: torch.Tensor, kv: torch.Tensor) -> None:
        if rows.numel():
            self.pack(kv.reshape(-1, kv.shape[-1]).float().contiguous(), self.rows, rows.reshape(-1))

    def window_rows(self, b: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        return b * self.window + slot

    def entry_rows(self, b: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.batch * self.window + b * self.entries + e


class WindowCache:
    """The last ``window`` keys of each row, ``keys[B, window, D]`` with their positions (-1: empty); with a
    :class:`KVPool`, also packed into it."""

    def __init__(self, batch: int, window: int, dim: int, dtype: torch.dtype, device, pool: KVPool | None = None):
        self.window = window
        self.keys = torch.zeros(batch, window, dim, dtype=dtype, device=device)
        self.pos = torch.full((batch, window), -1, dtype=torch.long, device=device)
        self.pool = pool

    def extend(self, kv: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys this chunk's queries may see (``[B, window + S, D]``, the cached window then the chunk) and
        their positions (-1 where empty or invalid); then the chunk's last valid keys enter the window."""
        keys = torch.cat([self.keys, kv.to(self.keys.dtype)], dim=1)
        kpos = torch.cat([self.pos, torch.where(valid, pos, torch.full_like(pos, -1))], dim=1)
        w = _last_writes(pos, valid, self.window)
        b, s = w.nonzero(as_tuple=True)
        slot = pos[b, s] % self.window
        self.keys[b, slot] = kv[b, s].to(self.keys.dtype)
        self.pos[b, slot] = pos[b, s]
        if self.pool is not None:
            self.pool.write(self.pool.window_rows(b, slot), kv[b, s])
        return keys, kpos

    def pool_rows(self, q_pos: torch.Tensor) -> torch.Tensor:
        """Pool rows of the window keys a query at ``q_pos[B]`` sees (``-1`` elsewhere), ``[B, window]``."""
        assert self.pool is not None
        b = torch.arange(self.pos.shape[0], device=self.pos.device).unsqueeze(1)
        slot = torch.arange(self.window, device=self.pos.device).unsqueeze(0)
        qp = q_pos.unsqueeze(1)
        seen = (self.pos >= 0) & (self.pos <= qp) & (self.pos > qp - self.window)
        return torch.where(seen, self.pool.window_rows(b, slot), torch.full_like(self.pos, -1))


class CompressorCache:
    """One compressor's state: a ring of source projections and the compressed entries.

    ``rate`` source tokens make one entry; with ``overlap`` (CSA) entry ``w`` also mixes the first half of
    window ``w-1``'s projections, so the ring keeps two windows. ``proj`` is the projection width (twice
    the entry width with overlap)."""

    def __init__(self, batch: int, rate: int, overlap: bool, proj: int, dim: int, max_len: int,
                 dtype: torch.dtype, device, pool: KVPool | None = None):
        self.rate, self.overlap, self.dim = rate, overlap, dim
        self.pool = pool
        self.ring = rate * (2 if overlap else 1)
        self.kv = torch.zeros(batch, self.ring, proj, dtype=dtype, device=device)
        self.gate = torch.zeros(batch, self.ring, proj, dtype=torch.float32, device=device)
        self.src_pos = torch.full((batch, self.ring), -1, dtype=torch.long, device=device)
        self.entries = torch.zeros(batch, max_len // rate + 1, dim, dtype=dtype, device=device)

    def windows(self, kv: torch.Tensor, gate: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor):
        """The source windows this chunk completes: ``(rows, entry_ids, kv[n, L, proj], gate[n, L, proj],
        src_ok[n, L])`` with ``L`` = one window, or two (previous then current) with overlap. Then the
        chunk's projections enter the ring."""
        m = self.rate
        done = valid & ((pos + 1) % m == 0)
        b, s = done.nonzero(as_tuple=True)
        w = pos[b, s] // m
        first = w * m - (m if self.overlap else 0)
        t = first.unsqueeze(1) + torch.arange(self.ring if self.overlap else m, device=pos.device)  # positions
        start = pos[:, 0][b].unsqueeze(1)
        in_chunk = t >= start
        ci = (t - start).clamp(min=0, max=pos.shape[1] - 1)
        ri = t.remainder(self.ring)
        bb = b.unsqueeze(1).expand_as(t)
        src_kv = torch.where(in_chunk.unsqueeze(-1), kv[bb, ci].to(self.kv.dtype), self.kv[bb, ri])
        src_gate = torch.where(in_chunk.unsqueeze(-1), gate[bb, ci].float(), self.gate[bb, ri])
        ok = (t >= 0) & torch.where(in_chunk, valid[bb, ci], self.src_pos[bb, ri] == t)
        wr = _last_writes(pos, valid, self.ring)
        wb, ws = wr.nonzero(as_tuple=True)
        slot = pos[wb, ws] % self.ring
        self.kv[wb, slot] = kv[wb, ws].to(self.kv.dtype)
        self.gate[wb, slot] = gate[wb, ws].float()
        self.src_pos[wb, slot] = pos[wb, ws]
        return b, w, src_kv, src_gate, ok

    def store(self, rows: torch.Tensor, entry_ids: torch.Tensor, entries: torch.Tensor) -> None:
        self.entries[rows, entry_ids] = entries.to(self.entries.dtype)
        if self.pool is not None:
            self.pool.write(self.pool.entry_rows(rows, entry_ids), entries)


class LayerCache:
    """What one V4 layer keeps between calls: its window, for CSA/HCA its compressor (and indexer), and
    with ``kv="fp8"`` the 584-byte pool that decode steps attend over."""

    def __init__(self, window: WindowCache, compressor: CompressorCache | None = None,
                 indexer: CompressorCache | None = None, pool: KVPool | None = None):
        self.window, self.compressor, self.indexer, self.pool = window, compressor, indexer, pool

    def decode_rows(self, q_pos: torch.Tensor, chosen: torch.Tensor | None) -> torch.Tensor:
        """Pool rows one decode query per sequence attends to: its window, then the chosen entries
        (``chosen[B, E]``), ``-1`` for none."""
        rows = self.window.pool_rows(q_pos)
        if chosen is None or self.pool is None:
            return rows
        b = torch.arange(chosen.shape[0], device=chosen.device).unsqueeze(1)
        e = torch.arange(chosen.shape[1], device=chosen.device).unsqueeze(0)
        picked = torch.where(chosen, self.pool.entry_rows(b, e), torch.full_like(e.expand_as(chosen), -1))
        return torch.cat([rows, picked], dim=1)
