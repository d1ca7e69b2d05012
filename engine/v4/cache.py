"""The V4 decode caches: a sliding window of keys and the state of a compressor.

Every layer has a :class:`WindowCache` (its last ``sliding_window`` keys, as a ring indexed by position);
CSA and HCA layers add a :class:`CompressorCache` for their compressed keys, and CSA layers a second one
for the lightning indexer's keys. A compressor cache holds the projections of the source tokens that its
next entries still need (a ring of one window, two for the overlapping CSA windows) and the entries
emitted so far. Rows of a batch advance independently: each call brings positions ``pos[b, s] = start_b + s``
and a ``valid`` mask, and only valid tokens are written, so ragged prompts share one prefill.

Every buffer has a fixed capacity and every write has a static shape: a write that must not land goes to
a trash slot (one extra row past the readable ones) instead of being filtered out on the host. No call
synchronises with the host, so a decode step can be captured as a CUDA graph; entries that do not exist
yet are masked by position (``n_visible``), never sliced off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Once = Callable[[tuple, Callable[[], Any]], Any]


def _last_writes(pos: torch.Tensor, valid: torch.Tensor, ring: int) -> torch.Tensor:
    """Which valid tokens to write to a ring of ``ring`` slots: the last ``ring`` of each row (no two
    writes then hit one slot)."""
    last = torch.where(valid, pos, torch.full_like(pos, -1)).amax(dim=1, keepdim=True)
    return valid & (pos > last - ring)


def _rows_of(pos: torch.Tensor) -> torch.Tensor:
    return torch.arange(pos.shape[0], device=pos.device).unsqueeze(1).expand_as(pos)


def _once(once: Once | None, key: tuple, make: Callable[[], Any]) -> Any:
    """``make()``, or through ``once`` (:meth:`engine.v4.compressor.Step.once`): the caches of all layers
    hold the same positions, so what depends only on positions (slots, masks, window indices) is made by
    the first layer of a forward and reused by the others."""
    return make() if once is None else once(key, make)


class KVPool:
    """A layer's 584-byte FP8 pool (:mod:`kernels.kv584`): the window's keys in rows ``b·W + slot``, then the
    compressed entries in rows ``B·W + b·E + e``, then one trash row that writes which must not land go
    to. Decode attends over it by row index."""

    def __init__(self, batch: int, window: int, entries: int, pack, device):
        from kernels.kv584 import new_pool

        self.window, self.entries, self.batch = window, entries, batch
        self.trash = batch * (window + entries)
        self.rows = new_pool(self.trash + 1, 1, device)
        self.pack = pack  # the kv584_store op (Triton, or the sync-free torch store)

    def write(self, rows: torch.Tensor, kv: torch.Tensor) -> None:
        if rows.numel():
            self.pack(kv.reshape(-1, kv.shape[-1]).float().contiguous(), self.rows, rows.reshape(-1))

    def window_rows(self, b: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        return b * self.window + slot

    def entry_rows(self, b: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.batch * self.window + b * self.entries + e

    def reset(self) -> None:
        self.rows.zero_()


class WindowCache:
    """The last ``window`` keys of each row, ``keys[B, window, D]`` with their positions (-1: empty); with a
    :class:`KVPool`, also packed into it. Slot ``window`` of the buffers is the trash slot."""

    def __init__(self, batch: int, window: int, dim: int, dtype: torch.dtype, device, pool: KVPool | None = None):
        self.window = window
        self._keys = torch.zeros(batch, window + 1, dim, dtype=dtype, device=device)
        self._pos = torch.full((batch, window + 1), -1, dtype=torch.long, device=device)
        self.keys, self.pos = self._keys[:, :window], self._pos[:, :window]
        self.pool = pool

    def reset(self) -> None:
        self._keys.zero_()
        self._pos.fill_(-1)

    def extend(self, kv: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor,
               once: Once | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys this chunk's queries may see (``[B, window + S, D]``, the cached window then the chunk) and
        their positions (-1 where empty or invalid); then the chunk's last valid keys enter the window."""
        def slots():
            kpos = torch.cat([self.pos, torch.where(valid, pos, -1)], dim=1)  # read before this write
            w = valid if pos.shape[1] == 1 else _last_writes(pos, valid, self.window)
            return kpos, w, _rows_of(pos), torch.where(w, pos % self.window, self.window)

        kpos, w, b, slot = _once(once, ("window", self.window), slots)
        keys = torch.cat([self.keys, kv.to(self.keys.dtype)], dim=1)
        self._keys[b, slot] = kv.to(self._keys.dtype)
        self._pos[b, slot] = pos
        if self.pool is not None:
            pool = self.pool
            rows = _once(once, ("window_pool", self.window, pool.trash),
                         lambda: torch.where(w, pool.window_rows(b, slot), pool.trash))
            pool.write(rows, kv)
        return keys, kpos

    def pool_rows(self, q_pos: torch.Tensor, once: Once | None = None) -> torch.Tensor:
        """Pool rows of the window keys a query at ``q_pos[B]`` sees (``-1`` elsewhere), ``[B, window]``."""
        pool = self.pool
        assert pool is not None

        def rows():
            b = torch.arange(self.pos.shape[0], device=self.pos.device).unsqueeze(1)
            slot = torch.arange(self.window, device=self.pos.device).unsqueeze(0)
            qp = q_pos.unsqueeze(1)
            seen = (self.pos >= 0) & (self.pos <= qp) & (self.pos > qp - self.window)
            return torch.where(seen, pool.window_rows(b, slot), torch.full_like(self.pos, -1))

        return _once(once, ("window_rows", self.window), rows)


class CompressorCache:
    """One compressor's state: a ring of source projections and the compressed entries.

    ``rate`` source tokens make one entry; with ``overlap`` (CSA) entry ``w`` also mixes the first half of
    window ``w-1``'s projections, so the ring keeps two windows. ``proj`` is the projection width (twice
    the entry width with overlap). ``entries[B, max_len // rate + 1, dim]`` has a fixed capacity; entry
    ``w`` exists once position ``(w + 1)·rate - 1`` was seen."""

    def __init__(self, batch: int, rate: int, overlap: bool, proj: int, dim: int, max_len: int,
                 dtype: torch.dtype, device, pool: KVPool | None = None):
        self.rate, self.overlap, self.dim = rate, overlap, dim
        self.pool = pool
        self.ring = rate * (2 if overlap else 1)
        self.capacity = max_len // rate + 1
        self._kv = torch.zeros(batch, self.ring + 1, proj, dtype=dtype, device=device)
        self._gate = torch.zeros(batch, self.ring + 1, proj, dtype=torch.float32, device=device)
        self._src_pos = torch.full((batch, self.ring + 1), -1, dtype=torch.long, device=device)
        self._entries = torch.zeros(batch, self.capacity + 1, dim, dtype=dtype, device=device)
        self.kv, self.gate = self._kv[:, : self.ring], self._gate[:, : self.ring]
        self.src_pos, self.entries = self._src_pos[:, : self.ring], self._entries[:, : self.capacity]

    def reset(self) -> None:
        self._kv.zero_()
        self._gate.zero_()
        self._src_pos.fill_(-1)
        self._entries.zero_()

    def windows(self, kv: torch.Tensor, gate: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor,
                once: Once | None = None):
        """The source windows this chunk may complete, ``ceil(S / rate)`` candidates per row: ``(rows,
        entry_ids, kv[n, L, proj], gate[n, L, proj], src_ok[n, L], done[n])`` with ``L`` = one window, or two
        (previous then current) with overlap; ``done`` marks the candidates whose window really completes
        here. Then the chunk's projections enter the ring."""
        m = self.rate
        bsz, s = pos.shape
        if s == 1:
            return self._decode_window(kv, gate, pos, valid, once)
        start = pos[:, 0]
        n_c = -(-s // m)
        s_c = ((m - 1 - start) % m).unsqueeze(1) + m * torch.arange(n_c, device=pos.device)  # [B, n_c]
        in_chunk_c = s_c < s
        s_cl = s_c.clamp(max=s - 1)
        done = (in_chunk_c & valid.gather(1, s_cl)).reshape(-1)
        b = torch.arange(bsz, device=pos.device).unsqueeze(1).expand(bsz, n_c).reshape(-1)
        w = ((start.unsqueeze(1) + s_cl) // m).reshape(-1)
        first = w * m - (m if self.overlap else 0)
        t = first.unsqueeze(1) + torch.arange(self.ring if self.overlap else m, device=pos.device)  # positions
        st = start[b].unsqueeze(1)
        in_chunk = t >= st
        ci = (t - st).clamp(min=0, max=s - 1)
        ri = t.remainder(self.ring)
        bb = b.unsqueeze(1).expand_as(t)
        src_kv = torch.where(in_chunk.unsqueeze(-1), kv[bb, ci].to(self.kv.dtype), self.kv[bb, ri])
        src_gate = torch.where(in_chunk.unsqueeze(-1), gate[bb, ci].float(), self.gate[bb, ri])
        ok = (t >= 0) & torch.where(in_chunk, valid[bb, ci], self.src_pos[bb, ri] == t)
        self._write_ring(kv, gate, pos, _last_writes(pos, valid, self.ring))
        return b, w, src_kv, src_gate, ok, done

    def _write_ring(self, kv: torch.Tensor, gate: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor,
                    slots: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        wb, slot = slots if slots is not None else (_rows_of(pos), torch.where(keep, pos % self.ring, self.ring))
        self._kv[wb, slot] = kv.to(self._kv.dtype)
        self._gate[wb, slot] = gate.float()
        self._src_pos[wb, slot] = pos

    def _decode_window(self, kv: torch.Tensor, gate: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor,
                       once: Once | None = None):
        """:meth:`windows` for one token per row, in fewer steps: the token enters the ring first, and then the
        window it may complete lies wholly in the ring (its slot held position ``pos - ring``, outside the
        window). Every cache of one rate and ring holds the same positions: the indices are shared."""
        m, key = self.rate, ("ring", self.rate, self.ring)

        def index():
            p = pos[:, 0]
            w = p // m
            t = (w * m - (m if self.overlap else 0)).unsqueeze(1) + torch.arange(self.ring if self.overlap else m,
                                                                                device=pos.device)
            b = torch.arange(pos.shape[0], device=pos.device).unsqueeze(1)
            slots = (_rows_of(pos), torch.where(valid, pos % self.ring, self.ring))
            return slots, valid[:, 0] & ((p + 1) % m == 0), w, t, b, t.remainder(self.ring)

        slots, done, w, t, b, ri = _once(once, key, index)
        self._write_ring(kv, gate, pos, valid, slots)
        ok = _once(once, key + ("ok",), lambda: (t >= 0) & (self.src_pos[b, ri] == t))  # after this write
        return b[:, 0], w, self.kv[b, ri], self.gate[b, ri], ok, done

    def store(self, rows: torch.Tensor, entry_ids: torch.Tensor, entries: torch.Tensor, done: torch.Tensor,
              once: Once | None = None) -> None:
        """Entries ``entries[n, dim]`` for ``(rows, entry_ids)`` where ``done`` (the others go to the trash)."""
        key = ("store", self.rate, self.ring, self.capacity)
        ids = _once(once, key, lambda: torch.where(done, entry_ids.clamp(max=self.capacity - 1), self.capacity))
        self._entries[rows, ids] = entries.to(self._entries.dtype)
        if self.pool is not None:
            pool = self.pool
            prow = _once(once, key + (pool.trash,), lambda: torch.where(done, pool.entry_rows(rows, ids), pool.trash))
            pool.write(prow, entries)


class LayerCache:
    """What one V4 layer keeps between calls: its window, for CSA/HCA its compressor (and indexer), and
    with ``kv="fp8"`` the 584-byte pool that decode steps attend over."""

    def __init__(self, window: WindowCache, compressor: CompressorCache | None = None,
                 indexer: CompressorCache | None = None, pool: KVPool | None = None):
        self.window, self.compressor, self.indexer, self.pool = window, compressor, indexer, pool

    def reset(self) -> None:
        """Empty every buffer in place (a captured graph keeps pointing at the same storage)."""
        for part in (self.window, self.compressor, self.indexer, self.pool):
            if part is not None:
                part.reset()

    def decode_rows(self, q_pos: torch.Tensor, chosen: torch.Tensor | None,
                    picks: torch.Tensor | None = None, once: Once | None = None) -> torch.Tensor:
        """Pool rows one decode query per sequence attends to: its window, then the chosen entries
        (``chosen[B, E]`` a mask over entry slots, or ``picks[B, k]`` entry ids with ``-1`` for none), ``-1``
        for none."""
        rows = self.window.pool_rows(q_pos, once)
        if self.pool is None:
            return rows
        if picks is not None:
            b = torch.arange(picks.shape[0], device=picks.device).unsqueeze(1)
            return torch.cat([rows, torch.where(picks >= 0, self.pool.entry_rows(b, picks), -1)], dim=1)
        if chosen is None:
            return rows
        b = torch.arange(chosen.shape[0], device=chosen.device).unsqueeze(1)
        e = torch.arange(chosen.shape[1], device=chosen.device).unsqueeze(0)
        picked = torch.where(chosen, self.pool.entry_rows(b, e), torch.full_like(e.expand_as(chosen), -1))
        return torch.cat([rows, picked], dim=1)
