"""One step's latent rows into a paged MLA cache: ``pages[block_table[b, p // P], p % P] = [latent | rope]``.

The paged cache (:class:`engine.paged_cache.PagedLatentCache`) stores each token as one row of
``kv_lora_rank + qk_rope_head_dim`` values in pages of ``P`` rows found through a block table. In torch the
write is half a dozen small device ops (page lookup, slot, concatenation, scatter); :func:`paged_kv_write` is
one launch, one program per ``(sequence, position)``, with no host sync (graph-capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.arch import capability
from kernels.harness import Case, Check, ParitySpec


def _check(pages, block_table, pos, latent, rope) -> tuple[int, int, int, int]:
    if pages.dim() != 3:
        raise ValueError(f"paged_kv_write: pages must be [pages, page_size, width], got {tuple(pages.shape)}")
    b, s = pos.shape
    c, r = latent.shape[-1], rope.shape[-1]
    if tuple(latent.shape) != (b, s, c) or tuple(rope.shape) != (b, s, r):
        raise ValueError(f"paged_kv_write: latent [{b}, {s}, C] and rope [{b}, {s}, R] expected for pos "
                         f"{tuple(pos.shape)}, got {tuple(latent.shape)} and {tuple(rope.shape)}")
    if c + r != pages.shape[2]:
        raise ValueError(f"paged_kv_write: rows of {c} + {r} values do not fit pages of width {pages.shape[2]}")
    if block_table.dim() != 2 or block_table.shape[0] < b:
        raise ValueError(f"paged_kv_write: block_table must have a row per sequence ({b}), got {tuple(block_table.shape)}")
    return b, s, c, r


def paged_kv_write_ref(pages: torch.Tensor, block_table: torch.Tensor, pos: torch.Tensor, latent: torch.Tensor,
                       rope: torch.Tensor) -> torch.Tensor:
    """Store ``latent[B, S, C]`` and ``rope[B, S, R]`` of sequences ``0..B-1`` at positions ``pos[B, S]`` into
    ``pages[num_pages, page_size, C + R]`` (in place; returns ``pages``)."""
    b, _, _, _ = _check(pages, block_table, pos, latent, rope)
    page_size = pages.shape[1]
    page = block_table[:b].gather(1, (pos // page_size).to(torch.int64)).long()
    pages[page, pos % page_size] = torch.cat([latent, rope], dim=-1).to(pages.dtype)
    return pages


@triton.jit
def _paged_kv_write_kernel(
    pages_ptr, bt_ptr, pos_ptr, lat_ptr, rope_ptr, S,
    stride_pp, stride_ps, stride_bt, stride_pos_b, stride_lb, stride_ls, stride_rb, stride_rs,
    PAGE: tl.constexpr, C: tl.constexpr, R: tl.constexpr, C_P2: tl.constexpr, R_P2: tl.constexpr,
):
    row = tl.program_id(0)
    b = row // S
    s = row % S
    p = tl.load(pos_ptr + b * stride_pos_b + s).to(tl.int64)
    page = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + p // PAGE).to(tl.int64)
    dst = pages_ptr + page * stride_pp + (p % PAGE) * stride_ps
    cc = tl.arange(0, C_P2)
    lat = tl.load(lat_ptr + b.to(tl.int64) * stride_lb + s * stride_ls + cc, mask=cc < C)
    tl.store(dst + cc, lat.to(pages_ptr.dtype.element_ty), mask=cc < C)
    rr = tl.arange(0, R_P2)
    rot = tl.load(rope_ptr + b.to(tl.int64) * stride_rb + s * stride_rs + rr, mask=rr < R)
    tl.store(dst + C + rr, rot.to(pages_ptr.dtype.element_ty), mask=rr < R)


def paged_kv_write(pages: torch.Tensor, block_table: torch.Tensor, pos: torch.Tensor, latent: torch.Tensor,
                   rope: torch.Tensor) -> torch.Tensor:
    """Triton :func:`paged_kv_write_ref`: one program per ``(sequence, position)`` row."""
    b, s, c, r = _check(pages, block_table, pos, latent, rope)
    if pages.stride(2) != 1 or latent.stride(-1) != 1 or rope.stride(-1) != 1 or block_table.stride(1) != 1:
        raise ValueError("paged_kv_write: pages, latent, rope and block_table need a unit last-dim stride")
    if pos.stride(1) != 1:
        pos = pos.contiguous()
    if b * s == 0:
        return pages
    _paged_kv_write_kernel[(b * s,)](
        pages, block_table, pos, latent, rope, s,
        pages.stride(0), pages.stride(1), block_table.stride(0), pos.stride(0),
        latent.stride(0), latent.stride(1), rope.stride(0), rope.stride(1),
        PAGE=pages.shape[1], C=c, R=r, C_P2=triton.next_power_of_2(c), R_P2=triton.next_power_of_2(r),
        num_warps=4 if capability(pages.device) is not None else 1,
    )
    return pages


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    b, s, c, r, page, n_pages = p["bscrpn"]
    per_seq = n_pages // b
    order = torch.randperm(n_pages, generator=gen, device=device)[: b * per_seq].view(b, per_seq)
    start = torch.randint(0, per_seq * page - s + 1, (b, 1), generator=gen, device=device)
    pos = start + torch.arange(s, device=device)
    pages = torch.randn(n_pages, page, c + r, generator=gen, device=device).to(case.dtype)
    lat = torch.randn(b, s, c + 7, generator=gen, device=device).to(case.dtype)[..., :c]  # a strided view
    rope = torch.randn(b, s, r, generator=gen, device=device).to(case.dtype)
    return {"pages": pages, "block_table": order.to(torch.int32), "pos": pos, "latent": lat, "rope": rope}


def _run(out, pages, **inp):
    out[0].copy_(pages)
    paged_kv_write(out[0], **inp)


SPEC = ParitySpec(
    op="paged_kv_write",
    make_inputs=_inputs,
    reference=lambda pages, **inp: paged_kv_write_ref(pages.clone(), **inp),
    kernel=_run,
    cases=[
        Case("decode b3 s1 c32 r8 p8", {"bscrpn": (3, 1, 32, 8, 8, 12)}),
        Case("prefill b2 s11 c32 r8 p4", {"bscrpn": (2, 11, 32, 8, 4, 10)}),
        Case("decode b128 c512 r64 p64", {"bscrpn": (128, 1, 512, 64, 64, 256)}, devices=("cuda",)),
    ],
    checks=[Check("bit_exact", 0, "a copy: every stored value is the input's")],
    description="latent + rope rows of one step into a paged MLA cache through the block table",
)
