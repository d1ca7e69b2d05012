"""DeepSeek-V4 routers: top-k over ``sqrtsoftplus`` (or softmax / sigmoid) scores with a selection bias,
and hash routing, where a frozen ``tid2eid[token]`` table picks the experts and the scores only weight them.

Both normalise the chosen scores to sum to one and multiply by ``routed_scaling_factor``. One program per
token row: the expert count of every V4 checkpoint fits in one block of registers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._launch import next_pow2
from kernels.harness import Case, Check, ParitySpec

SCORE_FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")


def scores_ref(logits: torch.Tensor, func: str) -> torch.Tensor:
    """Router scores in fp32. ``sqrtsoftplus(x) = sqrt(log(1 + e^x))``: positive, grows like √x."""
    x = logits.float()
    if func == "sqrtsoftplus":
        return torch.sqrt(F.softplus(x))
    if func == "softmax":
        return x.softmax(dim=-1)
    if func == "sigmoid":
        return torch.sigmoid(x)
    raise ValueError(f"router score function must be one of {SCORE_FUNCS}, got {func!r}")


def _weights(scores: torch.Tensor, ids: torch.Tensor, scaling: float) -> torch.Tensor:
    w = scores.gather(-1, ids)
    return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * scaling


def topk_route_ref(logits: torch.Tensor, bias: torch.Tensor | None, k: int, scaling: float,
                   func: str = "sqrtsoftplus") -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights[T, k] fp32, ids[T, k] int64)``: experts by ``score + bias`` (ties to the lower id), weights
    from the unbiased scores."""
    s = scores_ref(logits, func)
    sel = s if bias is None else s + bias.float()
    ids = sel.topk(k, dim=-1).indices
    return _weights(s, ids, scaling), ids


def hash_route_ref(logits: torch.Tensor, tid2eid: torch.Tensor, tokens: torch.Tensor, scaling: float,
                   func: str = "sqrtsoftplus") -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, ids)`` with ``ids = tid2eid[tokens]``: the token id alone decides the experts."""
    s = scores_ref(logits, func)
    ids = tid2eid[tokens.reshape(-1)].long()
    return _weights(s, ids, scaling), ids


# --- Triton ------------------------------------------------------------------------------------------

@triton.jit
def _score(x, valid, FUNC: tl.constexpr):
    if FUNC == 0:  # sqrtsoftplus, softplus written stably: max(x, 0) + log1p(exp(-|x|))
        sp = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
        s = tl.sqrt(sp)
    elif FUNC == 1:
        m = tl.max(tl.where(valid, x, float("-inf")), axis=0)
        e = tl.where(valid, tl.exp(x - m), 0.0)
        s = e / tl.sum(e, axis=0)
    else:
        s = tl.sigmoid(x)
    return s


@triton.jit
def _route_kernel(logit_ptr, bias_ptr, tok_ptr, table_ptr, w_ptr, id_ptr, E, scaling,
                  K: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr, FUNC: tl.constexpr, HASH: tl.constexpr,
                  HAS_BIAS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    valid = e < E
    x = tl.load(logit_ptr + t * E + e, mask=valid, other=0.0).to(tl.float32)
    s = _score(x, valid, FUNC)
    kk = tl.arange(0, KP)
    km = kk < K
    if HASH:
        tok = tl.load(tok_ptr + t)
        ids = tl.load(table_ptr + tok * K + kk, mask=km, other=-1).to(tl.int64)
        w = tl.sum(tl.where(e[None, :] == ids[:, None], s[None, :], 0.0), axis=1)
    else:
        sel = s
        if HAS_BIAS:
            sel = sel + tl.load(bias_ptr + e, mask=valid, other=0.0)
        sel = tl.where(valid, sel, float("-inf"))
        ids = tl.zeros([KP], dtype=tl.int64)
        w = tl.zeros([KP], dtype=tl.float32)
        for j in tl.static_range(K):
            m = tl.max(sel, axis=0)
            pick = tl.min(tl.where(sel == m, e, BLOCK_E), axis=0)  # ties to the lower id, like torch.topk
            sv = tl.sum(tl.where(e == pick, s, 0.0), axis=0)
            ids = tl.where(kk == j, pick.to(tl.int64), ids)
            w = tl.where(kk == j, sv, w)
            sel = tl.where(e == pick, float("-inf"), sel)
    w = w / (tl.sum(w, axis=0) + 1e-20) * scaling
    tl.store(w_ptr + t * K + kk, w, mask=km)
    tl.store(id_ptr + t * K + kk, ids, mask=km)


def _launch(logits, k, scaling, func, *, bias=None, tokens=None, table=None, out=None):
    if func not in SCORE_FUNCS:
        raise ValueError(f"router score function must be one of {SCORE_FUNCS}, got {func!r}")
    lg = logits.reshape(-1, logits.shape[-1]).contiguous()
    t, e = lg.shape
    w, ids = out if out is not None else (torch.empty(t, k, dtype=torch.float32, device=lg.device),
                                          torch.empty(t, k, dtype=torch.int64, device=lg.device))
    dummy = lg
    if t:
        _route_kernel[(t,)](lg, bias if bias is not None else dummy, tokens if tokens is not None else dummy,
                            table if table is not None else dummy, w, ids, e, float(scaling), K=k, KP=next_pow2(k),
                            BLOCK_E=next_pow2(e), FUNC=SCORE_FUNCS.index(func), HASH=table is not None,
                            HAS_BIAS=bias is not None)
    return w, ids


def topk_route(logits, bias, k, scaling, func="sqrtsoftplus", *, out=None):
    """Triton :func:`topk_route_ref` (the top-k comes out in descending order of ``score + bias``)."""
    return _launch(logits, k, scaling, func, bias=None if bias is None else bias.float().contiguous(), out=out)


def hash_route(logits, tid2eid, tokens, scaling, func="sqrtsoftplus", *, out=None):
    """Triton :func:`hash_route_ref`."""
    k = tid2eid.shape[1]
    return _launch(logits, k, scaling, func, tokens=tokens.reshape(-1).contiguous(),
                   table=tid2eid.contiguous(), out=out)


# --- parity ------------------------------------------------------------------------------------------

def _inputs(case: Case, device: torch.device, gen: torch.Generator) -> dict:
    p = case.params
    t, e, k = p["shape"]
    logits = 2 * torch.randn(t, e, generator=gen, device=device)
    inp = {"logits": logits, "k": k, "scaling": 1.5, "func": p.get("func", "sqrtsoftplus")}
    if p.get("hash"):
        vocab = 512
        table = torch.stack([torch.randperm(e, generator=gen, device=device)[:k] for _ in range(vocab)])
        inp = {"logits": logits, "tid2eid": table, "tokens": torch.randint(0, vocab, (t,), generator=gen,
               device=device), "scaling": 1.5, "func": inp["func"]}
    else:
        inp["bias"] = 0.05 * torch.randn(e, generator=gen, device=device)
    return inp


def _ref(**inp):
    w, ids = hash_route_ref(**inp) if "tid2eid" in inp else topk_route_ref(**inp)
    return w, ids


def _run(out, **inp):
    if "tid2eid" in inp:
        hash_route(**inp, out=out)
    else:
        topk_route(**inp, out=out)


def _cases(hash_: bool) -> list[Case]:
    h = {"hash": hash_}
    return [
        Case("7x16 top4", {"shape": (7, 16, 4), **h}, dtype=torch.float32),
        Case("6x32 top6", {"shape": (6, 32, 6), **h}, dtype=torch.float32),
        Case("5x256 top8 softmax", {"shape": (5, 256, 8), "func": "softmax", **h}, dtype=torch.float32),
        Case("3x64 top2 sigmoid", {"shape": (3, 64, 2), "func": "sigmoid", **h}, dtype=torch.float32),
        Case("flash 4096x256 top6", {"shape": (4096, 256, 6), **h}, dtype=torch.float32, devices=("cuda",)),
    ]


_CHECKS = [
    Check("allclose", 1.0, "fp32 scores; exp/log/sqrt implementations differ by ulps",
          opts={"atol": 1e-6, "rtol": 1e-5}, name="weights"),
    Check("bit_exact", 0, "the chosen experts are a discrete decision: any difference is a bug", output=1,
          name="ids"),
]

SPEC_TOPK = ParitySpec(op="sqrtsoftplus_topk", make_inputs=_inputs, reference=_ref, kernel=_run,
                       cases=_cases(False), checks=_CHECKS,
                       description="V4 router: top-k by sqrtsoftplus score + bias, normalised, scaled")
SPEC_HASH = ParitySpec(op="hash_routing", make_inputs=_inputs, reference=_ref, kernel=_run, cases=_cases(True),
                       checks=_CHECKS, description="V4 hash router: tid2eid lookup, sqrtsoftplus weights")
SPEC = SPEC_TOPK
