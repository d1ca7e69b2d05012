"""The lightning indexer's score and top-k: which compressed entries each query of a CSA layer attends to.

``score[b, s, t] = Σ_h w[b, s, h] · relu(q[b, s, h] · k[b, t]) · scale`` over the indexer's query heads, with
entries at or past the query's causal limit (``t >= n_visible[b, s]``) excluded; the ``topk`` best survive
and picks past the limit come back as ``-1``. The Triton kernel computes the scores (one program per
query row, all heads at once over key tiles); the selection is torch's ``topk`` on those scores, so both
paths choose by the same rule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._launch import next_pow2
from kernels.arch import interpreting
from kernels.harness import Case, Check, ParitySpec


def indexer_scores_ref(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, n_visible: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """``q[B, S, H, D]``, ``weights[B, S, H]`` (already scaled by ``H^-0.5``), ``keys[B, T, D]``,
    ``n_visible[B, S]`` → fp32 ``[B, S, T]`` with ``-inf`` at invisible entries."""
    s = torch.einsum("bshd,btd->bsht", q.float(), keys.float())
    s = (torch.relu(s) * scale * weights.float().unsqueeze(-1)).sum(dim=2)
    t = torch.arange(keys.shape[1], device=keys.device)
    return s.masked_fill(t.view(1, 1, -1) >= n_visible.unsqueeze(-1), float("-inf"))


def select_topk(scores: torch.Tensor, n_visible: torch.Tensor, topk: int) -> torch.Tensor:
    """``min(topk, T)`` best entries per query (int64), ``-1`` where fewer than that are visible."""
    k = min(topk, scores.shape[-1])
    idx = scores.topk(k, dim=-1).indices
    return torch.where(idx >= n_visible.unsqueeze(-1), torch.full_like(idx, -1), idx)


def indexer_topk_ref(q, weights, keys, n_visible, scale: float, topk: int) -> torch.Tensor:
    """The oracle: scores, then :func:`select_topk`."""
    return select_topk(indexer_scores_ref(q, weights, keys, n_visible, scale), n_visible, topk)


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def _scores_kernel(q_ptr, w_ptr, k_ptr, nv_ptr, o_ptr, S, T, scale, H: tl.constexpr, HP: tl.constexpr,
                   D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # b*S + s
    b = row // S
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    tm = t < T
    h = tl.arange(0, HP)  # heads padded to the MMA's 16 rows
    hm = h < H
    nv = tl.load(nv_ptr + row)
    acc = tl.zeros([HP, BLOCK_T], dtype=tl.float32)
    for d0 in tl.static_range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        qv = tl.load(q_ptr + row * H * D + h[:, None] * D + d[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
        kv = tl.load(k_ptr + b * T * D + t[None, :] * D + d[:, None], mask=tm[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(qv, kv, input_precision="ieee")
    w = tl.load(w_ptr + row * H + h, mask=hm, other=0.0).to(tl.float32)
    sc = tl.sum(tl.maximum(acc, 0.0) * scale * w[:, None], axis=0)
    sc = tl.where(t < nv, sc, float("-inf"))
    tl.store(o_ptr + row * T + t, sc, mask=tm)


def indexer_scores(q, weights, keys, n_visible, scale: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    b, s, h, d = q.shape
    t = keys.shape[1]
    o = out if out is not None else torch.empty(b, s, t, dtype=torch.float32, device=q.device)
    bt = 32 if interpreting() else 64
    bd = min(d, 64)
    if d % bd or bd < 16:
        raise ValueError(f"indexer: head dim ({d}) must be a multiple of {bd} (and at least 16)")
    if b * s and t:
        _scores_kernel[(b * s, triton.cdiv(t, bt))](q.contiguous(), weights.float().contiguous(), keys.contiguous(),
                                                    n_visible.to(torch.int32).contiguous(), o, s, t, float(scale),
                                                    H=h, HP=max(16, next_pow2(h)), D=d, BLOCK_T=bt, BLOCK_D=bd)
    return o


def indexer_topk(q, weights, keys, n_visible, scale: float, topk: int, *, out: torch.Tensor | None = None):
    """Triton scores, then :func:`select_topk`."""
    idx = select_topk(indexer_scores(q, weights, keys, n_visible, scale), n_visible, topk)
    if out is not None:
        out.copy_(idx)
        return out
    return idx


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    b, s, h, d, t, k = case.params["shape"]
    # offsets keep q·k mostly positive, so relu zeros (exact ties for top-k) stay rare
    q = (torch.randn(b, s, h, d, generator=gen, device=device) + 0.5).to(case.dtype)
    keys = (torch.randn(b, t, d, generator=gen, device=device) + 0.5).to(case.dtype)
    w = torch.rand(b, s, h, generator=gen, device=device) * h**-0.5
    nv = torch.randint(0, t + 1, (b, s), generator=gen, device=device)
    nv[0, 0] = t
    return {"q": q, "weights": w, "keys": keys, "n_visible": nv, "scale": d**-0.5, "topk": k}


def _ref(**inp):
    topk = inp.pop("topk")
    scores = indexer_scores_ref(**inp)
    return scores, select_topk(scores, inp["n_visible"], topk).sort(dim=-1).values


def _run(out, **inp):
    topk = inp.pop("topk")
    indexer_scores(**inp, out=out[0])
    out[1].copy_(select_topk(out[0], inp["n_visible"], topk).sort(dim=-1).values)


SPEC = ParitySpec(
    op="indexer_topk", make_inputs=_inputs, reference=_ref, kernel=_run,
    cases=[Case("2x3 h4 d32 t40 top8", {"shape": (2, 3, 4, 32, 40, 8)}, dtype=torch.float32),
           Case("1x2 h16 d64 t70 top16 bf16", {"shape": (1, 2, 16, 64, 70, 16)}),
           Case("flash decode 64 h64 d128 t4096 top512", {"shape": (64, 1, 64, 128, 4096, 512)}, devices=("cuda",)),
           Case("flash decode 8 h64 d128 t32768 top512", {"shape": (8, 1, 64, 128, 32768, 512)}, devices=("cuda",))],
    checks=[Check("allclose", 1.0, "fp32 dot products over D in tiles; relu-weighted sums over heads",
                  opts={"atol": 1e-4, "rtol": 1e-4}, name="scores"),
            Check("bit_exact", 0, "the chosen set (sorted) is a discrete decision: any difference is a bug",
                  output=1, name="indices")],
    description="lightning indexer: relu(q·k) weighted over heads, causal limit, top-k with -1 padding",
)
