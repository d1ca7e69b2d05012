"""Where the V4 engine's Triton and torch backends part in bf16: op by op, layer by layer, choice by choice.

    PYTHONPATH=. python3 benchmarks/v4_divergence.py --preset small            # cuda, the engine bench's prompts
    PYTHONPATH=. python3 benchmarks/v4_divergence.py --smoke                   # tiny, CPU, Triton interpreter

Three models hold the same random weights (engine.v4.tiny, bf16 values): bf16 on the torch backend (the
oracle the bench compares against), bf16 on the Triton backend, and fp32 on the torch backend (the same
model without bf16 rounding). On the engine bench's ragged prompts it reports:

1. **ops**: every op call of the torch model's prefill (and first decode step) re-run on its own recorded
   inputs by the torch reference, the Triton kernel and the reference in fp32
   (:func:`engine.v4.trace.local_errors`): ``‖triton − torch‖``, ``‖torch − fp32‖``, ``‖triton − fp32‖``
   over ``‖fp32‖``, max over calls; for discrete ops the rows whose choice set differs. A kernel whose
   error against fp32 is well above the reference's is less accurate than its oracle (flagged ``LESS``).
2. **layers**: the prefill's stream outputs per layer, each bf16 backend against the other and against fp32
   (errors that propagated), and the prefill's last-token logits (max |Δlogit|: the bf16 noise floor).
3. **decode**: greedy decode on all three; the bench's classification (Triton vs torch, near-tie when the
   torch margin at the first differing step is < 0.1) next to torch vs fp32 and Triton vs fp32, and for
   every divergence: the gap, in the reference's logits, between its token and the candidate's, and the
   first discrete choice (router expert set, indexer top-k set) that flipped upstream in that row, with
   its margin in the reference's own scores.

Everything comes from one run; ``--out DIR`` also writes ``divergence.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU kernels

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.golden import GoldenRecord, compare_records  # noqa: E402
from engine.v4.config import parse_v4_config  # noqa: E402
from engine.v4.generate import V4Decoder  # noqa: E402
from engine.v4.loader import load_v4_tensors  # noqa: E402
from engine.v4.tiny import PRESETS, random_weights  # noqa: E402
from engine.v4.trace import OpTrace, choice_flips, layer_outputs, local_errors, rel_err  # noqa: E402

NEAR_TIE = 0.1  # the engine bench's threshold (torch's top-1 − top-2 margin at the first differing step)
TRACED = {"hc_pre", "hc_post", "hc_head", "topk_route", "hash_route", "indexer_topk", "attention", "sparse_decode",
          "kv_pack", "rmsnorm"}  # kv_pack: only counted (a dense-KV run must show none on either backend)
T0 = time.perf_counter()
KV = "dense"  # the KV layout of every decode here (--kv)


def bench_prompts(n: int, vocab: int) -> list[list[int]]:
    """The engine bench's ragged prompts (.dev/v4-engine.sh's ``compare``): seed 3, these lengths."""
    g = torch.Generator().manual_seed(3)
    lens = (5, 40, 130, 17, 300, 64, 9, 200)
    return [torch.randint(2, min(250, vocab), (k,), generator=g).tolist() for k in lens][:n]


def build(preset: str, device: torch.device, overrides: dict | None = None) -> tuple[dict, dict, dict]:
    cfg_dict = dict(PRESETS[preset], **(overrides or {}))
    cfg = parse_v4_config(cfg_dict, preset)
    tensors = random_weights(cfg_dict, seed=0, dtype=torch.bfloat16)
    models = {"torch": load_v4_tensors(cfg, tensors, dtype=torch.bfloat16, device=device, backend="torch"),
              "triton": load_v4_tensors(cfg, tensors, dtype=torch.bfloat16, device=device, backend="triton"),
              "fp32": load_v4_tensors(cfg, tensors, dtype=torch.float32, device=device, backend="torch")}
    return models, cfg_dict, tensors


class Run:
    """One model's greedy decode of the prompts, eager, with every forward's logits and an op trace."""

    def __init__(self, model, prompts: list[list[int]], steps: int, keep_inputs: bool, kv: str = "dense"):
        self.logits: list[torch.Tensor] = []
        hook = model.register_forward_hook(lambda m, a, o: self.logits.append(o.detach().float().clone()))
        try:  # the decoder is made inside the trace: a KV pool keeps the store op it was given
            with OpTrace(model, TRACED, keep_inputs=keep_inputs) as tr, layer_outputs(model) as outs:
                dec = V4Decoder(model, len(prompts), max(map(len, prompts)) + steps, kv=kv, graphs=False)
                self.gens = dec.generate(prompts, steps)
        finally:
            hook.remove()
        self.trace, self.layers = tr, outs
        self.resolved = model.ops.resolved()
        self.valid = tr.calls[0].valid if tr.calls else None  # the prefill's real tokens [B, S]

    def records(self) -> list[GoldenRecord]:
        return [GoldenRecord(i, g.prompt, g.tokens, g.margins) for i, g in enumerate(self.gens)]


def fmt(x: float) -> str:
    return "nan" if x != x else ("inf" if math.isinf(x) else f"{x:.2e}")


def section_ops(runs: dict, res: dict, forwards: tuple[int, ...]) -> None:
    tr = runs["torch"].trace
    rows: list[dict] = []
    for fwd in forwards:
        for e in local_errors(tr, forward=fwd):
            less = (e.triton_vs_fp32 > 2 * e.torch_vs_fp32 and e.triton_vs_fp32 > 1e-6
                    and e.part != "choice")
            rows.append({"forward": fwd, "op": e.op, "layer": e.layer, "part": e.part, "calls": e.calls,
                         "triton_vs_torch": e.tri_vs_torch, "torch_vs_fp32": e.torch_vs_fp32,
                         "triton_vs_fp32": e.triton_vs_fp32, "flips": e.flips, "triton_less_accurate": less})
    res["ops"] = rows
    print("\n## ops on the torch model's own inputs (rel. to ||fp32||, max over calls; fwd 0 = prefill, 1 = step 1)")
    print("| fwd | op | layer | out | triton-torch | torch-fp32 | triton-fp32 | note |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["part"] == "choice":
            f = r["flips"]
            note = (f"choice sets differ on {f['triton/torch']}/{f['rows']} rows triton/torch, "
                    f"{f['torch/fp32']} torch/fp32, {f['triton/fp32']} triton/fp32")
            print(f"| {r['forward']} | {r['op']} | {r['layer']} | choice | | | | {note} |")
            continue
        note = ("LESS accurate than the reference" if r["triton_less_accurate"] else
                "no Triton kernel (torch on both)" if r["triton_vs_fp32"] != r["triton_vs_fp32"] else "")
        print(f"| {r['forward']} | {r['op']} | {r['layer']} | {r['part']} | {fmt(r['triton_vs_torch'])} | "
              f"{fmt(r['torch_vs_fp32'])} | {fmt(r['triton_vs_fp32'])} | {note} |")


def _valid_rows(run: Run, t: torch.Tensor) -> torch.Tensor | None:
    v = run.valid
    return v.reshape(-1) if v is not None and v.numel() == math.prod(t.shape[:2]) else None


def section_layers(runs: dict, res: dict) -> None:
    a, b, f = (runs[k] for k in ("torch", "triton", "fp32"))
    out = []
    print("\n## prefill stream outputs per layer (propagated; rel. to ||fp32||, real tokens only)")
    print("| layer | triton-torch | torch-fp32 | triton-fp32 |")
    print("|---|---|---|---|")
    n_layers = 1 + max((i for i, _ in f.layers), default=-1)
    for i in range(n_layers):  # the first n_layers entries are the prefill's
        ta, tb, tf = a.layers[i][1], b.layers[i][1], f.layers[i][1]
        rows = _valid_rows(a, ta)
        r = {"layer": i, "triton_vs_torch": rel_err(tb, ta, tf, rows), "torch_vs_fp32": rel_err(ta, tf, tf, rows),
             "triton_vs_fp32": rel_err(tb, tf, tf, rows)}
        out.append(r)
        print(f"| {i} | {fmt(r['triton_vs_torch'])} | {fmt(r['torch_vs_fp32'])} | {fmt(r['triton_vs_fp32'])} |")
    la, lb, lf = a.logits[0], b.logits[0], f.logits[0]
    floor = {"triton_vs_torch": (lb - la).abs().max().item(), "torch_vs_fp32": (la - lf).abs().max().item(),
             "triton_vs_fp32": (lb - lf).abs().max().item()}
    per = [{"prompt": i, **{k: (x[i] - y[i]).abs().max().item() for k, (x, y) in
                            {"triton_vs_torch": (lb, la), "torch_vs_fp32": (la, lf), "triton_vs_fp32": (lb, lf)}.items()}}
           for i in range(la.shape[0])]
    res["layers"], res["step0_logits_max_abs"], res["step0_logits_per_prompt"] = out, floor, per
    print(f"step-0 logits max |Δ| (the bf16 noise floor): triton-torch {floor['triton_vs_torch']:.3f}, "
          f"torch-fp32 {floor['torch_vs_fp32']:.3f}, triton-fp32 {floor['triton_vs_fp32']:.3f}")


def _row_of(flip, s_prefill: int) -> int:
    """The prompt (batch row) a flip belongs to."""
    return flip.row // s_prefill if flip.forward == 0 else flip.row


def _pos_of(flip, s_prefill: int, lens: list[int]) -> int:
    b = _row_of(flip, s_prefill)
    return flip.row % s_prefill if flip.forward == 0 else lens[b] + flip.forward - 1


def choice_noise(ref: Run, cand: Run) -> dict[str, float]:
    """Per data-dependent op, how far rounding moves its selection scores between the two runs on the
    prefill (same tokens): the 99th percentile over real rows of ``max |score_ref − score_cand|``."""
    from engine.v4.trace import DATA_CHOICES, choice_scores

    out: dict[str, list[torch.Tensor]] = {}
    for a, b in zip(ref.trace.of_any(DATA_CHOICES, 0), cand.trace.of_any(DATA_CHOICES, 0)):
        sa, sb = choice_scores(a), choice_scores(b)
        if sa is None or sb is None:
            continue
        d = (sa - sb.to(sa.device)).nan_to_num(0.0, 0.0, 0.0).abs().amax(dim=-1)
        if a.valid is not None and a.valid.numel() == d.numel():
            d = d[a.valid.reshape(-1).to(d.device)]
        out.setdefault(a.op, []).append(d.float().cpu())
    return {op: torch.quantile(torch.cat(v), 0.99).item() for op, v in out.items() if torch.cat(v).numel()}


def classify(ref: Run, cand: Run, ref_name: str, cand_name: str, lens: list[int]) -> dict:
    """The bench's classification plus, per divergence, the candidate token's gap in the reference's
    logits, the first discrete flip upstream in that row, and a cause: ``logit near-tie`` (the reference's
    gap to the candidate's token < 0.1), ``<op> near-tie`` (an upstream router / indexer choice flipped
    whose margin in the reference's scores is within the rounding shift of those scores), or
    ``unexplained`` (what a bug would look like)."""
    comp = compare_records(ref.records(), cand.records(), near_tie=NEAR_TIE)
    s0 = max(lens)
    flips = choice_flips(ref.trace, cand.trace)
    noise = choice_noise(ref, cand)
    prompts = []
    for p in comp.prompts:
        d: dict = {"prompt": p.index, "status": p.status, "first": p.first_divergence,
                   "ref_margin": p.reference_margin}
        if p.first_divergence is not None and p.got is not None:
            k = p.first_divergence
            lg = ref.logits[k][p.index]
            d["gap_to_cand_token"] = gap = (lg[p.expected] - lg[p.got]).item()
            d["cand_rank_in_ref"] = int((lg > lg[p.got]).sum().item())
            up = [f for f in flips if _row_of(f, s0) == p.index and f.forward <= k]
            tied = [f for f in up if f.swap_ref <= noise.get(f.op, 0.0)]
            if up:
                f = up[0]
                d["first_flip"] = {"forward": f.forward, "layer": f.layer, "op": f.op, "pos": _pos_of(f, s0, lens),
                                   "ref": f.ref, "cand": f.cand, "margin": f.margin, "swap_ref": f.swap_ref,
                                   "swap_cand": f.swap_cand}
            d["flips_upstream"] = len(up)
            d["cause"] = ("logit near-tie" if gap < NEAR_TIE else
                          f"{tied[0].op} near-tie (L{tied[0].layer}, margin {tied[0].swap_ref:.4f})" if tied else
                          "unexplained")
        prompts.append(d)
    counts = {st: sum(p["status"] == st for p in prompts) for st in ("match", "near-tie", "break", "short")}
    causes: dict[str, int] = {}
    for pr in prompts:
        if "cause" in pr:
            c = pr["cause"].split(" (")[0]
            causes[c] = causes.get(c, 0) + 1
    return {"ref": ref_name, "cand": cand_name, "counts": counts, "causes": causes, "prompts": prompts,
            "choice_noise_p99": noise,
            "flips_total": len(flips), "flip_margins": sorted(f.swap_ref for f in flips)[:20]}


def section_decode(runs: dict, res: dict, lens: list[int]) -> None:
    pairs = [("torch", "triton"), ("fp32", "torch"), ("fp32", "triton")]
    res["decode"] = []
    for r, c in pairs:
        out = classify(runs[r], runs[c], r, c, lens)
        res["decode"].append(out)
        noise = ", ".join(f"{op} {v:.4f}" for op, v in out["choice_noise_p99"].items())
        print(f"\n## decode {c} vs {r} (reference {r}): {out['counts']}, divergences by cause {out['causes']}; "
              f"{out['flips_total']} discrete choice "
              f"flips in all (smallest swap margins {[round(m, 4) for m in out['flip_margins'][:6]]}; "
              f"rounding shift of the choice scores, p99: {noise})")
        print("| prompt | len | status | first step | ref top-2 margin | ref gap to cand token (rank) | "
              "first flip upstream (fwd, layer, op, pos, swap margin ref / cand) | flips upstream | cause |")
        print("|---|---|---|---|---|---|---|---|---|")
        for p in out["prompts"]:
            ff = p.get("first_flip")
            fl = (f"{ff['forward']}, L{ff['layer']}, {ff['op']}, pos {ff['pos']}, {ff['swap_ref']:.4f} / "
                  f"{ff['swap_cand']:.4f}" if ff else "-")
            gap = (f"{p['gap_to_cand_token']:.4f} ({p['cand_rank_in_ref']})" if "gap_to_cand_token" in p else "-")
            rm = "-" if p["ref_margin"] is None else f"{p['ref_margin']:.4f}"
            print(f"| {p['prompt']} | {lens[p['prompt']]} | {p['status']} | "
                  f"{'-' if p['first'] is None else p['first']} | {rm} | {gap} | {fl} | {p.get('flips_upstream', '-')} | {p.get('cause', '')} |")


def section_ablation(models: dict, runs: dict, res: dict, prompts: list[list[int]], steps: int, ops: list[str],
                     variants: tuple[str, ...], budget: float = math.inf) -> None:
    """Which op's Triton kernel the breaks follow: decode with only that op on Triton (the rest torch), and
    with every op on Triton but that one, each classified against the torch model as the bench does."""
    m = models["triton"]
    ref = runs["torch"].records()
    out = []
    print("\n## ablation: decode vs the torch model with one op switched (counts: match/near-tie/break)")
    print("| op | only this op on triton | all on triton but this op |")
    print("|---|---|---|")
    try:
        for op in ops:
            if time.perf_counter() - T0 > budget:
                print(f"[ablation stops before {op}: past the {budget:.0f}s budget]")
                break
            row: dict = {"op": op}
            for name, backend in (("only", {"default": "torch", op: "triton"}),
                                  ("all_but", {"default": "triton", op: "torch"})):
                if name not in variants:
                    continue
                m.ops.use(backend)
                dec = V4Decoder(m, len(prompts), max(map(len, prompts)) + steps, kv=KV, graphs=False)
                gens = dec.generate(prompts, steps)
                comp = compare_records(ref, [GoldenRecord(i, g.prompt, g.tokens, g.margins)
                                             for i, g in enumerate(gens)], near_tie=NEAR_TIE)
                row[name] = {st: sum(p.status == st for p in comp.prompts) for st in ("match", "near-tie", "break")}
            out.append(row)
            print(f"| {op} | " + " | ".join(f"{x['match']}/{x['near-tie']}/{x['break']}" if (x := row.get(k)) else "-"
                                            for k in ("only", "all_but")) + " |")
        if time.perf_counter() - T0 < budget:  # a rounding-order change alone, with no kernel involved
            t = models["torch"]
            t.ops.resolved()
            saved = t.ops._fns["hc_post"]
            t.ops._fns["hc_post"] = hc_post_round_once
            try:
                dec = V4Decoder(t, len(prompts), max(map(len, prompts)) + steps, kv=KV, graphs=False)
                gens = dec.generate(prompts, steps)
            finally:
                t.ops._fns["hc_post"] = saved
            comp = compare_records(ref, [GoldenRecord(i, g.prompt, g.tokens, g.margins) for i, g in enumerate(gens)],
                                   near_tie=NEAR_TIE)
            row = {"op": "torch, hc_post rounded once", "only": {st: sum(p.status == st for p in comp.prompts)
                                                                 for st in ("match", "near-tie", "break")}}
            out.append(row)
            x = row["only"]
            print(f"| torch with hc_post rounded once (Triton's order, no kernel) | {x['match']}/{x['near-tie']}/"
                  f"{x['break']} | - |")
    finally:
        m.ops.use("triton")
    res["ablation"] = out


VIEW_OPS = {"slice", "unsqueeze", "reshape", "view", "select", "expand", "expand_as", "transpose", "t", "view_as_complex",
            "view_as_real", "flatten", "_unsafe_view", "alias", "squeeze", "permute", "split", "split_with_sizes",
            "chunk", "unbind", "as_strided", "detach", "_reshape_alias", "narrow", "_conj", "conj"}


def dispatched_ops(fn) -> int:
    """Non-view aten ops ``fn()`` dispatches (each one kernel or more on a GPU; Triton launches not counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func).split(".")[1] if str(func).startswith("aten.") else str(func)
            if name not in VIEW_OPS:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def perf_decode(engine: str, cfg_dict: dict, tensors: dict, backend: str, dev: torch.device, b: int = 4) -> dict:
    """Decode-step cost of ``engine`` (a package with the V4 engine's layout: ``engine.v4`` or a renamed copy
    of an older tree) at batch ``b`` on the engine bench's prompts: dispatched ops of an eager step, and on
    CUDA the graphed step's time (20 replays, CUDA events) and kernels (profiler, 5 replays)."""
    import importlib

    config = importlib.import_module(engine + ".config")
    loader = importlib.import_module(engine + ".loader")
    gen = importlib.import_module(engine + ".generate")
    m = loader.load_v4_tensors(config.parse_v4_config(cfg_dict, "perf"), tensors, dtype=torch.bfloat16, device=dev,
                               backend=backend)
    ps = [[5 + i % 200] * (8 + (3 * i) % 40) for i in range(b)]
    cap = max(map(len, ps)) + 48
    out: dict = {"engine": engine, "backend": backend, "batch": b}
    with torch.inference_mode():
        eager = gen.V4Decoder(m, b, cap, graphs=False)
        eager.generate(ps, 2)
        out["eager_ops_per_step"] = dispatched_ops(eager.step)
        if dev.type != "cuda":
            return out
        dec = gen.V4Decoder(m, b, cap, graphs=True)
        dec.generate(ps, 2)
        out["graphed"] = dec.graphed
        for _ in range(3):
            dec.step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            dec.step()
        end.record()
        torch.cuda.synchronize()
        out["step_ms"] = start.elapsed_time(end) / 20
        out["tok_s"] = b / out["step_ms"] * 1e3
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                dec.step()
            torch.cuda.synchronize()
        dt = [float(getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0) or 0)
              for e in p.key_averages()]
        kern = [(e, t) for e, t in zip(p.key_averages(), dt) if t > 0 and not e.key.startswith(("aten::", "cuda"))]
        out["kernels_per_step"] = sum(e.count for e, _ in kern) / 5
        out["device_us_per_step"] = sum(t for _, t in kern) / 5
        out["top_kernels"] = [(e.key[:90], e.count / 5, t / 5) for e, t in sorted(kern, key=lambda k: -k[1])[:25]]
    del m
    return out


def section_perf(cfg_dict: dict, tensors: dict, dev: torch.device, res: dict, before: str | None,
                 backends: tuple[str, ...] = ("triton", "torch"), batches: tuple[int, ...] = (4,)) -> None:
    rows = []
    engines = ([("engine_v4_before", before)] if before else []) + [("engine.v4", None)]
    for name, path in engines:
        if path:
            sys.path.insert(0, path)
        for backend, b in [(k, b) for b in batches for k in backends]:
            if time.perf_counter() - T0 > res.get("_budget", math.inf):
                print(f"[perf stops before {name} {backend} b{b}: past the budget]")
                break
            rows.append(perf_decode(name, cfg_dict, tensors, backend, dev, b))
            r = rows[-1]
            print(f"perf {name:<16} {backend:<6} b{r['batch']}: eager {r['eager_ops_per_step']} dispatched ops/step"
                  + (f"; graph {r['step_ms']:.3f} ms/step = {r['tok_s']:.0f} tok/s, {r['kernels_per_step']:.0f} "
                     f"kernels/step, {r['device_us_per_step']:.0f} us device/step (graphed: {r['graphed']})"
                     if "step_ms" in r else "") + f"  [{time.perf_counter() - T0:.1f}s]")
    res["perf"] = rows
    last = rows[-1] if rows else {}
    for r in rows:
        if r["engine"] == "engine.v4" and r["backend"] == "triton" and r["batch"] == 4 and "top_kernels" in r:
            last = r
    if "top_kernels" in last:
        print(f"top kernels of the graphed step ({last['engine']}, {last['backend']}, b{last['batch']}): "
              "name | per step | us per step")
        for name, n, us in last["top_kernels"]:
            print(f"|  {name} | {n:.0f} | {us:.1f} |")


def hc_post_round_once(o: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """:func:`kernels.hc.hc_post_ref` with the Triton kernel's rounding: the weights cast to ``x.dtype`` as
    the reference does, then ``post·o + combᵀx`` in fp32 and one rounding (the reference rounds the
    product, the mix and their sum to bf16 separately, as HF does)."""
    dt = x.dtype
    y = post.to(dt).float().unsqueeze(-1) * o.float().unsqueeze(-2)
    return (y + torch.matmul(comb.to(dt).float().transpose(-1, -2), x.float())).to(dt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--budget", type=float, default=1e9, help="seconds; later sections are skipped past it")
    ap.add_argument("--out", default=None)
    ap.add_argument("--before", default=None, help="a directory holding engine_v4_before (an older engine/v4, "
                    "imports renamed) whose decode step the perf section measures beside this one")
    ap.add_argument("--kv", default="dense", choices=("dense", "fp8"),
                    help="fp8: decode steps attend over the 584-byte FP8 pool (Triton: kv584_store + sparse_mla_decode)")
    ap.add_argument("--set", default=None, help="JSON config overrides of the preset (e.g. a 512-wide head)")
    ap.add_argument("--perf-batches", default="4", help="comma-separated decode batches the perf section times")
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out")
    ap.add_argument("--smoke", action="store_true", help="tiny preset, CPU, 3 prompts x 3 steps (CI)")
    args = ap.parse_args()
    global KV
    KV = args.kv
    if args.smoke:
        args.preset, args.device, args.prompts, args.steps = "tiny", "cpu", 3, 2
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 model and fp32 replays are true fp32
    torch.backends.cudnn.allow_tf32 = False
    res: dict = {"preset": args.preset, "device": str(dev), "steps": args.steps, "kv": args.kv}  # "_budget": read by sections
    res["_budget"] = args.budget
    models, cfg_dict, tensors = build(args.preset, dev, json.loads(args.set) if args.set else None)
    cfg = models["torch"].cfg
    prompts = bench_prompts(args.prompts, cfg.vocab_size)
    if args.smoke:  # short prompts that still cross the tiny preset's window, compression and top-k limits
        prompts = [p[:n] for p, n in zip(prompts, (5, 17, 9))]
    lens = [len(p) for p in prompts]
    print(f"{args.preset} on {dev}, kv {args.kv}: {len(prompts)} prompts (lengths {lens}) x {args.steps} steps; "
          f"built in {time.perf_counter() - T0:.1f}s")
    runs = {}
    for name in ("torch", "triton", "fp32"):
        runs[name] = Run(models[name], prompts, args.steps, keep_inputs=True, kv=args.kv)
    res["resolved"] = {k: r.resolved for k, r in runs.items()}
    from collections import Counter

    calls = {k: dict(Counter(c.op for c in r.trace.calls)) for k, r in runs.items()}
    res["calls"] = calls
    print("op calls (prefill + decode): " + "; ".join(f"{k}: " + ", ".join(f"{op} {n}" for op, n in sorted(v.items()))
                                                     for k, v in calls.items()))
    tri = runs["triton"].resolved
    print("triton backend runs: " + ", ".join(f"{op}={b}" for op, b in sorted(tri.items()))
          + f"  [{time.perf_counter() - T0:.1f}s]")
    failed = 0
    kernels = [op for op, b in sorted(tri.items()) if b == "triton" and op in TRACED and op not in ("sparse_decode", "kv_pack")]
    if args.smoke:
        kernels = kernels[:1]
    sections = (("layers", lambda: section_layers(runs, res)), ("decode", lambda: section_decode(runs, res, lens)),
                ("ops", lambda: section_ops(runs, res, (1,) if args.smoke else (0, 1))),
                ("perf", lambda: section_perf(cfg_dict, tensors, dev, res, args.before,
                                              ("torch",) if args.smoke else ("triton", "torch"),
                                              tuple(int(b) for b in args.perf_batches.split(",")))),
                ("ablation", lambda: section_ablation(models, runs, res, prompts, args.steps, kernels,
                                                      ("only",) if args.smoke else ("only", "all_but"),
                                                      args.budget)))
    for name, fn in sections:
        if name in args.skip.split(","):
            continue
        if time.perf_counter() - T0 > args.budget:
            print(f"[skip {name}: past the {args.budget:.0f}s budget]")
            continue
        try:
            fn()
        except Exception as exc:
            failed += 1
            print(f"section error: {name}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        print(f"[{name} done at {time.perf_counter() - T0:.1f}s]")
        if args.out:  # after every section: a run cut short keeps what it measured
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "divergence.json").write_text(json.dumps(res, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
