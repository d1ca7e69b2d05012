"""Op-level traces of the V4 model, to find where two backends (or two precisions) part.

The model's hot ops all go through its :class:`~engine.v4.ops.V4Ops` (hyper-connections, routers, the
indexer, attention, the KV pool); everything else (linears, norms, rope, the compressor's pooling) is the
same torch code on both backends, so on equal inputs it gives equal outputs. :class:`OpTrace` records every
op call of a forward (op, layer, inputs, output, the rows that are real tokens), and :func:`replay` runs a
recorded call again on its own inputs with another implementation:

- ``"torch"``: the op's torch reference (what ``backend="torch"`` calls),
- ``"triton"``: the op's Triton kernel,
- ``"fp32"``: the torch reference on the inputs upcast to fp32 (the same op without bf16 rounding).

:func:`local_errors` compares them on every recorded call, so a table says per op whether the Triton kernel
is further from the fp32 result than the torch reference is (a kernel less accurate than its oracle), or
both are bf16-rounded alike. :func:`choice_flips` compares the discrete choices (router expert sets,
indexer top-k sets) of two traces and gives each flip's margin in the reference's own scores, so a
divergence that starts at a near-tie of a discrete op can be told from one that starts at a wrong number.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from engine.v4.model import DeepseekV4
from engine.v4.ops import OPS, SYNC_FREE

DISCRETE = {"topk_route": 1, "hash_route": 1, "indexer_topk": None}  # op -> which output holds the choice
# choices that depend on the data, not only on the token id (a hash layer's experts change only with the token)
DATA_CHOICES = ("topk_route", "indexer_topk")


@dataclass
class Call:
    op: str
    layer: int | str  # decoder layer index, or "head"
    forward: int  # which forward call of the model (0: prefill, then one per decode step)
    args: tuple
    kwargs: dict
    out: object
    valid: torch.Tensor | None  # [B, S] real tokens of this forward (padding excluded from every measure)


def _clone(x):
    if isinstance(x, torch.Tensor):  # with the same strides: a kernel may take another path for a strided view
        y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        return y.copy_(x.detach())
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    return x


def impl(op: str, which: str) -> Callable | None:
    """The implementation of ``op`` that ``which`` ("torch", "triton", "fp32") names; None if it has none."""
    module_name, ref = OPS[op]
    module = importlib.import_module(module_name)
    if which == "triton":
        return getattr(module, ref.removesuffix("_ref"), None)
    if which == "torch" and op in SYNC_FREE:
        mod, name = SYNC_FREE[op]
        return getattr(importlib.import_module(mod), name)
    return getattr(module, ref)


class OpTrace:
    """Records the op calls of ``model`` while active (``with OpTrace(model) as tr: model(...)``).

    ``ops``: which ops to record (default all); ``keep_inputs=False`` keeps outputs only (enough for
    :func:`choice_flips`, and small)."""

    def __init__(self, model: DeepseekV4, ops: set[str] | None = None, keep_inputs: bool = True):
        self.model, self.keep_inputs = model, keep_inputs
        self.ops = set(OPS) if ops is None else set(ops)
        self.calls: list[Call] = []
        self._layer: int | str = "?"
        self._valid: torch.Tensor | None = None
        self._forward = -1
        self._saved: dict[str, Callable] = {}
        self._hooks: list = []

    def __enter__(self) -> OpTrace:
        ops = self.model.ops
        ops.resolved()  # every op's function chosen (and the ones without a kernel named)
        for op in self.ops:
            fn = ops._fns[op]
            self._saved[op] = fn
            ops._fns[op] = self._wrap(op, fn)
        body = self.model.model
        self._hooks.append(self.model.register_forward_pre_hook(self._on_forward))
        for i, layer in enumerate(body.layers):
            self._hooks.append(layer.register_forward_pre_hook(self._on_layer(i)))
        self._hooks.append(body.hc_head.register_forward_pre_hook(self._on_layer("head")))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self.model.ops._fns.update(self._saved)
        self._saved.clear()

    def _on_forward(self, module, args, kwargs=None):
        self._forward += 1
        tokens = args[0]
        valid = args[2] if len(args) > 2 and args[2] is not None else None
        self._valid = valid.detach().clone() if valid is not None else torch.ones_like(tokens, dtype=torch.bool)

    def _on_layer(self, i: int | str):
        def hook(module, args):
            self._layer = i
        return hook

    def _wrap(self, op: str, fn: Callable) -> Callable:
        def traced(*args, **kwargs):
            a: tuple = _clone(args) if self.keep_inputs else ()
            k: dict = _clone(kwargs) if self.keep_inputs else {}
            if op == "kv_pack" and a:  # the pool is an in-place output: keep the rows it writes, not the pool
                a = (a[0], None, a[2])
            out = fn(*args, **kwargs)
            self.calls.append(Call(op, self._layer, self._forward, a, k, None if op == "kv_pack" else _clone(out),
                                   self._valid))
            return out
        return traced

    def of(self, op: str, forward: int | None = None) -> list[Call]:
        return self.of_any((op,), forward)

    def of_any(self, ops, forward: int | None = None) -> list[Call]:
        return [c for c in self.calls if c.op in ops and (forward is None or c.forward == forward)]


def _upcast(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.float()
    if isinstance(x, (tuple, list)):
        return type(x)(_upcast(v) for v in x)
    return x


def replay(call: Call, which: str):
    """``call``'s op run again on its recorded inputs by ``which`` ("torch", "triton", "fp32"); None when
    that implementation does not exist (no Triton kernel) or the call kept no inputs."""
    if not call.args or call.op == "kv_pack":
        return None
    fn = impl(call.op, which)
    if fn is None:
        return None
    args, kwargs = (_upcast(call.args), _upcast(call.kwargs)) if which == "fp32" else (call.args, call.kwargs)
    return fn(*args, **kwargs)


def _rows_mask(call: Call, shape: torch.Size, lead: int) -> torch.Tensor | None:
    """Which of the first ``lead`` flattened dims' rows are real tokens (None: all, or unknown layout)."""
    v = call.valid
    if v is None:
        return None
    n = math.prod(shape[:lead])
    if v.numel() == n:
        return v.reshape(-1)
    return None


def _float_parts(op: str, out) -> list[tuple[str, torch.Tensor, int]]:
    """(name, tensor, leading token dims) of an op's floating outputs."""
    if op == "hc_pre":
        return [("x", out[0], out[0].dim() - 1), ("post", out[1], out[1].dim() - 1),
                ("comb", out[2], out[2].dim() - 2)]
    if op in ("topk_route", "hash_route"):
        return [("w", out[0], 1)]
    if op in ("hc_post",):
        return [("streams", out, out.dim() - 2)]
    if op == "rmsnorm":
        return [("out", out, out.dim() - 1)]
    if op in ("hc_head", "attention"):
        return [("out", out, out.dim() - (2 if op == "attention" else 1))]
    if op == "sparse_decode":
        return [("out", out, 1)]
    if op in ("moe_dense", "moe_mxfp4", "moe_mxfp4_qat"):
        return [("out", out, 1)]
    return []


def rel_err(a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None = None) -> float:
    """``‖a − b‖ / ‖ref‖`` (Frobenius) over the real rows."""
    a, b, ref = a.float(), b.float(), ref.float()
    if rows is not None:
        a, b, ref = (t.reshape(rows.numel(), -1)[rows.to(t.device)] for t in (a, b, ref))
    den = ref.norm().item()
    return (a - b).norm().item() / den if den > 0 else float((a - b).norm().item())


@dataclass
class OpError:
    op: str
    layer: int | str
    part: str
    calls: int
    tri_vs_torch: float  # max over calls of ‖triton − torch‖ / ‖fp32‖
    torch_vs_fp32: float
    triton_vs_fp32: float
    flips: dict = field(default_factory=dict)  # discrete ops: rows whose choice set differs, per pair


def _sets(idx: torch.Tensor) -> torch.Tensor:
    return idx.reshape(-1, idx.shape[-1]).sort(dim=-1).values


def local_errors(trace: OpTrace, forward: int | None = None) -> list[OpError]:
    """Per (op, layer, output): each implementation against the others on the recorded inputs (the calls of
    ``forward``, or all)."""
    acc: dict[tuple, OpError] = {}
    for call in trace.calls:
        if forward is not None and call.forward != forward:
            continue
        outs = {w: replay(call, w) for w in ("torch", "triton", "fp32")}
        if outs["torch"] is None or outs["fp32"] is None:
            continue
        tri = outs["triton"]
        parts = {w: _float_parts(call.op, o) for w, o in outs.items() if o is not None}
        for j, (name, ref32, lead) in enumerate(parts["fp32"]):
            t = parts["torch"][j][1]
            rows = _rows_mask(call, ref32.shape, lead)
            key = (call.op, call.layer, name)
            e = acc.setdefault(key, OpError(call.op, call.layer, name, 0, 0.0, 0.0, 0.0))
            e.calls += 1
            e.torch_vs_fp32 = max(e.torch_vs_fp32, rel_err(t, ref32, ref32, rows))
            if tri is not None:
                tt = parts["triton"][j][1]
                e.tri_vs_torch = max(e.tri_vs_torch, rel_err(tt, t, ref32, rows))
                e.triton_vs_fp32 = max(e.triton_vs_fp32, rel_err(tt, ref32, ref32, rows))
            else:
                e.tri_vs_torch = e.triton_vs_fp32 = float("nan")
        if call.op in DISCRETE:
            key = (call.op, call.layer, "choice")
            e = acc.setdefault(key, OpError(call.op, call.layer, "choice", 0, 0.0, 0.0, 0.0,
                                            {"triton/torch": 0, "torch/fp32": 0, "triton/fp32": 0, "rows": 0}))
            e.calls += 1
            sets = {w: _sets(_choice(call.op, o)) for w, o in outs.items() if o is not None}
            rows = call.valid.reshape(-1).to(sets["torch"].device) if call.valid is not None else None
            if rows is not None and rows.numel() != sets["torch"].shape[0]:
                rows = None
            e.flips["rows"] += int(rows.sum()) if rows is not None else sets["torch"].shape[0]
            for a, b in (("triton", "torch"), ("torch", "fp32"), ("triton", "fp32")):
                if a in sets:
                    diff = (sets[a] != sets[b]).any(dim=-1)
                    e.flips[f"{a}/{b}"] += int((diff & rows).sum() if rows is not None else diff.sum())
    return list(acc.values())


def _choice(op: str, out) -> torch.Tensor:
    return out[1] if DISCRETE[op] == 1 else out


def choice_scores(call: Call) -> torch.Tensor | None:
    """Per row of a discrete call, the fp32 scores it chose by (``[rows, candidates]``): a router's
    ``score + bias``, the indexer's scores (``-inf`` at invisible entries); None without inputs."""
    if not call.args:
        return None
    if call.op == "topk_route":
        from kernels.hash_routing import scores_ref

        logits, bias = call.args[0], call.args[1]
        func = call.args[4] if len(call.args) > 4 else call.kwargs.get("func", "sqrtsoftplus")
        sel = scores_ref(logits, func)
        return sel + bias.float() if bias is not None else sel
    if call.op == "indexer_topk":
        from kernels.indexer import indexer_scores_ref

        q, w, keys, nv, scale = call.args[:5]
        return indexer_scores_ref(q, w, keys, nv, scale).reshape(-1, keys.shape[1])
    return None


def _k(call: Call) -> int:
    return int(call.args[2] if call.op == "topk_route" else call.args[5])


def choice_margins(call: Call) -> torch.Tensor | None:
    """Per row of a discrete call: the gap, in its own fp32 scores, between the last chosen and the first
    left-out candidate (``score[k-th] − score[(k+1)-th]``; +inf where nothing was left out). A flip at a row
    with a small gap is a near-tie of that choice."""
    sel = choice_scores(call)
    if sel is None:
        return None
    k = min(_k(call), sel.shape[-1])
    if sel.shape[-1] <= k:
        return torch.full(sel.shape[:1], math.inf, device=sel.device)
    top = sel.topk(k + 1, dim=-1).values
    gap = top[:, k - 1] - top[:, k]
    return torch.where(torch.isfinite(top[:, k]), gap, torch.full_like(gap, math.inf))  # all visible chosen


def swap_margin(sel: torch.Tensor, mine: list[int], theirs: list[int]) -> float:
    """How much ``sel`` (one row's scores) prefers the picks only ``mine`` has over those only ``theirs`` has:
    ``min(sel[mine − theirs]) − max(sel[theirs − mine])``; > 0 where ``sel`` made the choice ``mine``."""
    a = sorted(set(mine) - set(theirs) - {-1})
    b = sorted(set(theirs) - set(mine) - {-1})
    if not a or not b:
        return math.inf
    return (sel[a].min() - sel[b].max()).item()


@dataclass
class Flip:
    forward: int
    layer: int | str
    op: str
    row: int  # flattened token row (b * S + s) of that forward
    ref: list[int]
    cand: list[int]
    margin: float  # the reference's own top-k boundary gap at this row (see choice_margins)
    swap_ref: float = float("nan")  # the reference's preference for its picks over the candidate's (>= 0)
    swap_cand: float = float("nan")  # the same in the candidate's scores (<= 0: it preferred its own)

    @property
    def shift(self) -> float:
        """How far the candidate's scores moved across this choice: ``swap_ref − swap_cand``. A flip whose
        ``swap_ref`` is no larger than the shift the two runs' rounding gives elsewhere is a near-tie."""
        return self.swap_ref - self.swap_cand


def choice_flips(ref: OpTrace, cand: OpTrace) -> list[Flip]:
    """Rows where the two traces' data-dependent choices (router top-k, indexer top-k) differ, in call order
    (forward, then layer order), with the margin of each choice in the reference's scores (``nan`` where
    ``ref`` kept no inputs) and, where both kept inputs, the swap margins in both runs' scores. The traces
    must come from the same inputs (prompts and tokens) up to the first flip's forward."""
    out: list[Flip] = []
    rc = [c for c in ref.calls if c.op in DATA_CHOICES]
    cc = [c for c in cand.calls if c.op in DATA_CHOICES]
    for a, b in zip(rc, cc):
        if (a.op, a.layer, a.forward) != (b.op, b.layer, b.forward):
            break
        sa, sb = _sets(_choice(a.op, a.out)), _sets(_choice(b.op, b.out)).to(_choice(a.op, a.out).device)
        diff = (sa != sb).any(dim=-1)
        if a.valid is not None and a.valid.numel() == diff.numel():
            diff &= a.valid.reshape(-1).to(diff.device)
        if not bool(diff.any()):
            continue
        m = choice_margins(a)
        sc_a, sc_b = choice_scores(a), choice_scores(b)
        for r in diff.nonzero().flatten().tolist():
            ra, rb = sa[r].tolist(), sb[r].tolist()
            f = Flip(a.forward, a.layer, a.op, r, ra, rb, float(m[r]) if m is not None else float("nan"))
            if sc_a is not None:
                f.swap_ref = swap_margin(sc_a[r], ra, rb)
            if sc_b is not None:
                f.swap_cand = -swap_margin(sc_b[r], rb, ra)
            out.append(f)
    return out


@contextmanager
def layer_outputs(model: DeepseekV4) -> Iterator[list[tuple[int, torch.Tensor]]]:
    """Collects ``(layer, streams out)`` of every decoder layer call while active (clones, fp32 not forced)."""
    seen: list[tuple[int, torch.Tensor]] = []
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: seen.append((i, o.detach().clone())))
             for i, layer in enumerate(model.model.layers)]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()
