"""Paged latent KV cache for absorbed-MLA decode (the layout FlashMLA and vLLM use).

Each cached token is one row of ``kv_lora_rank + qk_rope_head_dim`` numbers (the normalised latent, then the
rotated rope key), stored in pages of ``page_size`` rows. A sequence owns a list of pages, recorded in its
row of ``block_table``; ``seq_lens`` says how many of its rows are valid. Every layer has its own pages and
shares the block table. Pages come from a free list, so sequences of different lengths share one pool
and a finished sequence's pages go back to it.

The tensors are allocated once and only ever written in place, so a captured CUDA graph that reads
``block_table`` and ``seq_lens`` keeps seeing the current values.
"""

from __future__ import annotations

import torch


class CacheFull(RuntimeError):
    """The page pool cannot hold another sequence of the requested length."""


class PagedLatentCache:
    def __init__(
        self,
        n_layers: int,
        kv_lora_rank: int,
        rope_dim: int,
        num_pages: int,
        max_batch: int,
        max_pages_per_seq: int,
        *,
        page_size: int = 64,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cpu",
        poison: bool = True,
    ):
        if min(n_layers, kv_lora_rank, rope_dim, num_pages, max_batch, max_pages_per_seq, page_size) < 1:
            raise ValueError("paged cache: every size must be at least 1")
        self.kv_lora_rank, self.rope_dim, self.page_size = kv_lora_rank, rope_dim, page_size
        width = kv_lora_rank + rope_dim
        fill = float("nan") if poison else 0.0  # NaN: a kernel reading a slot it does not own shows it
        self.pages = torch.full((n_layers, num_pages, page_size, width), fill, dtype=dtype, device=device)
        self.block_table = torch.zeros(max_batch, max_pages_per_seq, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self._free = list(range(num_pages - 1, -1, -1))
        self._owned: dict[int, list[int]] = {}

    @property
    def capacity(self) -> int:
        """Tokens one sequence can hold (its block-table row's length in pages, times the page size)."""
        return self.block_table.shape[1] * self.page_size

    def layer(self, i: int) -> torch.Tensor:
        """Layer ``i``'s pages, ``[num_pages, page_size, kv_lora_rank + rope_dim]``."""
        return self.pages[i]

    def free_pages(self) -> int:
        return len(self._free)

    def reserve(self, seq: int, n_tokens: int) -> None:
        """Give sequence ``seq`` pages for ``n_tokens`` tokens (it keeps the ones it has)."""
        if not 0 <= seq < self.block_table.shape[0]:
            raise ValueError(f"paged cache: sequence slot {seq} outside 0..{self.block_table.shape[0] - 1}")
        if n_tokens > self.capacity:
            raise CacheFull(f"paged cache: {n_tokens} tokens exceed the {self.capacity} a sequence can hold "
                            f"({self.block_table.shape[1]} pages of {self.page_size})")
        have = self._owned.setdefault(seq, [])
        need = -(-n_tokens // self.page_size) - len(have)
        if need > len(self._free):
            raise CacheFull(f"paged cache: sequence {seq} needs {need} more page(s), {len(self._free)} free")
        new = [self._free.pop() for _ in range(max(need, 0))]
        if new:
            have += new
            self.block_table[seq, len(have) - len(new): len(have)] = torch.tensor(new, dtype=torch.int32)

    def release(self, seq: int) -> None:
        """Return sequence ``seq``'s pages to the pool and mark it empty. Its block-table row still names
        the old pages until it is reserved again, so :meth:`write` must not target it meanwhile."""
        self._free += reversed(self._owned.pop(seq, []))
        self.seq_lens[seq] = 0

    def gather(self, layer: int, batch: int, n_tokens: int) -> torch.Tensor:
        """Rows ``0..n_tokens-1`` of sequences ``0..batch-1`` of ``layer``, ``[batch, n_tokens, width]`` (a copy;
        slots never written hold the poison value)."""
        t = torch.arange(n_tokens, device=self.block_table.device)
        page = self.block_table[:batch, t // self.page_size].long()
        return self.pages[layer][page, t % self.page_size]

    def write(self, layer: int, pos: torch.Tensor, latent: torch.Tensor, rope: torch.Tensor) -> None:
        """Store rows for sequences ``0..B-1`` at positions ``pos[B, S]``: ``latent[B, S, C]``, ``rope[B, S, R]``.
        Device-side indexing only (graph-capturable)."""
        b = pos.shape[0]
        page = self.block_table[:b].gather(1, (pos // self.page_size).to(torch.int64)).long()
        slot = pos % self.page_size
        layer_pages = self.pages[layer]
        row = torch.cat([latent, rope], dim=-1).to(layer_pages.dtype)
        layer_pages[page, slot] = row
