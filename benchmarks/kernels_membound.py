#!/usr/bin/env python3
# ruff: noqa: B023, E402  (torch is imported after the interpreter switch; timed lambdas run in their loop)
"""Memory-bound kernels on one GPU, in one run: the copy-bandwidth ceiling, the full parity sweep, then
GB/s and % of that ceiling for each op against torch eager and torch.compile over decode → prefill sizes,
DeepSeek's one-program-per-block act_quant design as an anchor, launch-config variants, the compiler's
register/spill report, and a short table last. Results (JSON + text) go under $OUT (or --out).

    PYTHONPATH=. python3 benchmarks/kernels_membound.py            # on a CUDA machine
    python benchmarks/kernels_membound.py --smoke                   # tiny sizes on CPU: the script runs

Bytes counted are the fewest an op must move (each input read once, each output written once).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for kernels_membound.{json,txt}")
ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU under the Triton interpreter")
ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
ap.add_argument("--no-variants", action="store_true", help="skip the launch-config sweep")
ap.add_argument("--ops", default="", help="comma list: only these ops (parity, bandwidth and variants)")
ap.add_argument("--budget", type=float, default=330.0, help="seconds; later items are skipped past it")
ARGS = ap.parse_args()
# compiled kernels on the GPU, the interpreter for --smoke; decided before any kernel module is imported
os.environ["TRITON_INTERPRET"] = "1" if ARGS.smoke else "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.fp8_gemm_anchor import _ds_act_quant_kernel, ds_act_quant  # noqa: E402
from kernels import fp8_quant, rmsnorm, rope, silu_mul  # noqa: E402
from kernels.harness import device_info, format_table, results_json, run_spec  # noqa: E402
from kernels.registry import load_spec  # noqa: E402

T0 = time.perf_counter()
DEV = "cpu" if ARGS.smoke else "cuda"
OPS = ["rmsnorm", "rmsnorm_residual", "act_quant", "act_quant_ue8m0", "act_dequant", "weight_dequant",
       "rope", "silu_mul", "silu_mul_quant"]
RESULTS: dict = {"device": None, "ceiling": {}, "parity": None, "bench": [], "anchors": [], "variants": [],
                 "compiler": [], "notes": []}
LINES: list[str] = []


def say(s: str = "") -> None:
    print(s, flush=True)
    LINES.append(s)


def left() -> float:
    return ARGS.budget - (time.perf_counter() - T0)


def save() -> None:
    os.makedirs(ARGS.out, exist_ok=True)
    with open(os.path.join(ARGS.out, "kernels_membound.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    with open(os.path.join(ARGS.out, "kernels_membound.txt"), "w") as f:
        f.write("\n".join(LINES) + "\n")


def bench_ms(fn, graph: bool = False) -> float:
    """Median ms per call: CUDA events with L2 flushed between calls (triton's do_bench); ``graph`` replays
    a CUDA graph instead, so launch overhead drops out. On CPU (smoke) one timed call."""
    if DEV == "cpu":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median")
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


# DeepSeek's reference act_quant design (one program per 128-element block) is the anchor: fp8_gemm_anchor.


# --- the ops under test: inputs, the three implementations, bytes moved -----------------------------

def gen(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


HIDDEN = 256 if ARGS.smoke else 7168  # DeepSeek-V3 hidden size
INTER = 256 if ARGS.smoke else 18432  # its dense MLP intermediate size
HEADS = 4 if ARGS.smoke else 128


def op_rmsnorm(rows, residual=False, d=HIDDEN):
    x, w = gen(rows, d), (torch.rand(d, device=DEV) + 0.5).bfloat16()
    o = torch.empty_like(x)
    if residual:
        r, h = gen(rows, d), torch.empty_like(x)
        return dict(
            triton=lambda tune=None: rmsnorm.rmsnorm(x, w, 1e-6, r, out=o, h_out=h, tune=tune),
            ref=rmsnorm.rmsnorm_ref, args=(x, w, 1e-6, r), bytes=4 * rows * d * 2 + d * 2, shape=f"{rows}x{d}")
    return dict(triton=lambda tune=None: rmsnorm.rmsnorm(x, w, 1e-6, out=o, tune=tune),
                ref=rmsnorm.rmsnorm_ref, args=(x, w, 1e-6), bytes=2 * rows * d * 2 + d * 2, shape=f"{rows}x{d}",
                alt=("F.rms_norm", lambda: torch.nn.functional.rms_norm(x, (d,), w, 1e-6)))


def op_act_quant(rows, d=HIDDEN):
    x = gen(rows, d, scale=3.0)
    q = torch.empty(rows, d, dtype=torch.float8_e4m3fn, device=DEV)
    s = torch.empty(rows, d // 128, dtype=torch.float32, device=DEV)
    return dict(triton=lambda tune=None: fp8_quant.act_quant(x, out=(q, s), tune=tune),
                ref=fp8_quant.act_quant_ref, args=(x,), bytes=rows * d * 3 + rows * (d // 128) * 4,
                shape=f"{rows}x{d}", anchor=lambda: ds_act_quant(x, q, s))


def op_silu_mul(rows, n=INTER, quant=False):
    x = gen(rows, 2 * n, scale=2.0)
    if quant:
        q = torch.empty(rows, n, dtype=torch.float8_e4m3fn, device=DEV)
        s = torch.empty(rows, n // 128, dtype=torch.float32, device=DEV)
        return dict(triton=lambda tune=None: silu_mul.silu_mul_quant(x, out=(q, s), tune=tune),
                    ref=silu_mul.silu_mul_quant_ref, args=(x,), bytes=rows * n * (4 + 1) + rows * (n // 128) * 4,
                    shape=f"{rows}x2*{n}")
    o = torch.empty(rows, n, dtype=torch.bfloat16, device=DEV)
    return dict(triton=lambda tune=None: silu_mul.silu_mul(x, out=o, tune=tune), ref=silu_mul.silu_mul_ref,
                args=(x,), bytes=rows * n * 6, shape=f"{rows}x2*{n}")


def op_rope(rows, heads=HEADS, dim=64, nope=128):
    q = gen(1, rows, heads, nope + dim)
    x = q[..., nope:]
    cos, sin = rope.yarn_freqs(dim, rows, 10000.0, 40.0, 4096)
    cos, sin = cos.to(DEV), sin.to(DEV)
    o = torch.empty(1, rows, heads, dim, dtype=torch.bfloat16, device=DEV)
    return dict(triton=lambda tune=None: rope.rope(x, cos, sin, out=o, tune=tune), ref=rope.rope_ref,
                args=(x, cos, sin), bytes=rows * heads * dim * 2 * 2 + rows * dim * 4, shape=f"q_pe 1x{rows}x{heads}x{dim}")


def op_weight_dequant(n, k=HIDDEN):
    w = (torch.randn(n, k, device=DEV) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.rand(-(-n // 128), -(-k // 128), device=DEV) * 1e-3
    o = torch.empty(n, k, dtype=torch.bfloat16, device=DEV)
    return dict(triton=lambda tune=None: fp8_quant.weight_dequant(w, s, out_dtype=torch.bfloat16, out=o, tune=tune),
                ref=lambda w, s: fp8_quant.weight_dequant_ref(w, s, out_dtype=torch.bfloat16), args=(w, s),
                bytes=n * k * 3 + s.numel() * 4, shape=f"{n}x{k}")


ROWS = [4] if ARGS.smoke else [1, 4, 16, 64, 256, 1024, 4096, 16384, 32768]
BENCH = [
    ("rmsnorm", op_rmsnorm, ROWS),
    ("rmsnorm_residual", lambda r: op_rmsnorm(r, residual=True), ROWS),
    ("act_quant", op_act_quant, ROWS),
    ("silu_mul", op_silu_mul, ROWS),
    ("silu_mul_quant", lambda r: op_silu_mul(r, quant=True), ROWS),
    ("rope", op_rope, ROWS),
    ("weight_dequant", op_weight_dequant, [128] if ARGS.smoke else [512, 2048, 7168, 18432]),
]
DECODE_MAX = 64
COMPILE_ROWS = {"weight_dequant": 256 if ARGS.smoke else 18432}  # torch.compile at the prefill size only


def section(title: str) -> None:
    say("")
    say(f"== {title} ({time.perf_counter() - T0:.0f}s)")


ERRORS: list[str] = []
ONLY = set(filter(None, ARGS.ops.split(",")))


def section_error(what: str, tb: str) -> None:
    """A broken item is reported (and fails the run) without costing the rest of the sweep."""
    ERRORS.append(what)
    say(f"section error: {what}: {tb.strip().splitlines()[-1]}")


def main() -> int:
    info = device_info(DEV)
    RESULTS["device"] = info
    say(f"device: {info}")

    # 1. the ceiling: a device-to-device copy, bytes read + written
    section("copy-bandwidth ceiling")
    ceiling = 0.0
    for mib in ([64] if ARGS.smoke else [256, 1024, 2048]):
        n = mib << 20
        src, dst = torch.randint(0, 255, (n,), dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
        ms = bench_ms(lambda d=dst, s=src: d.copy_(s))
        gbs = 2 * n / ms / 1e6
        ceiling = max(ceiling, gbs)
        RESULTS["ceiling"][f"{mib}MiB"] = gbs
        say(f"copy {mib} MiB: {ms * 1e3:.1f} us, {gbs:.0f} GB/s (read + write)")
        del src, dst
    RESULTS["ceiling"]["max"] = ceiling
    save()

    # 2. parity: every spec's full sweep on this device
    section("parity")
    rows = []
    for op in OPS:
        if ONLY and op not in ONLY:
            continue
        try:
            spec = load_spec(op)
            if ARGS.smoke:  # one CPU case per op: the suite runs them all
                spec = dataclasses.replace(spec, cases=[c for c in spec.cases if "cpu" in c.devices][:1])
            rows += run_spec(spec, DEV)
        except Exception:
            RESULTS["notes"].append(f"parity {op}: {traceback.format_exc()}")
            section_error(f"parity {op}", traceback.format_exc())
    RESULTS["parity"] = results_json(rows, DEV)
    say(format_table(rows))
    torch.cuda.empty_cache() if DEV == "cuda" else None
    save()

    # 3. triton vs eager (and torch.compile at a few sizes), decode → prefill
    section("bandwidth: triton vs torch eager")
    for name, make, sizes in BENCH:
        if ONLY and name not in ONLY:
            continue
        for r in sizes:
            if left() < 60:
                RESULTS["notes"].append(f"budget: skipped {name} {r}")
                continue
            rec = {"op": name, "rows": r}
            try:
                case = make(r)
                rec.update(shape=case["shape"], bytes=case["bytes"])
                ms = bench_ms(case["triton"])
                rec["triton_us"] = ms * 1e3
                eager = lambda: case["ref"](*case["args"])  # noqa: E731
                rec["eager_us"] = bench_ms(eager) * 1e3
                if r <= DECODE_MAX and DEV == "cuda":
                    rec["triton_graph_us"] = bench_ms(case["triton"], graph=True) * 1e3
                    rec["eager_graph_us"] = bench_ms(eager, graph=True) * 1e3
                if "anchor" in case:
                    rec["anchor_us"] = bench_ms(case["anchor"]) * 1e3
                if "alt" in case:  # the library's own fused op, where torch has one
                    rec["alt"] = case["alt"][0]
                    rec["alt_us"] = bench_ms(case["alt"][1]) * 1e3
                for k in ("triton", "eager", "anchor", "alt"):
                    if f"{k}_us" in rec:
                        rec[f"{k}_gbs"] = case["bytes"] / (rec[f"{k}_us"] * 1e3)
                        rec[f"{k}_pct"] = 100 * rec[f"{k}_gbs"] / ceiling
                del case
            except Exception:
                rec["error"] = traceback.format_exc()
                section_error(f"bandwidth {name} rows={r}", rec["error"])
            RESULTS["bench"].append(rec)
            say(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rec.items()
                         if k != "error") + (f" ERROR {rec['error'].splitlines()[-1]}" if "error" in rec else ""))
        save()

    # 4. launch-config variants at one prefill size, to pick the defaults
    if not ARGS.no_variants:
        section("launch-config variants")
        big = 2 if ARGS.smoke else 16384
        grids = [
            ("rmsnorm", lambda: op_rmsnorm(big), [{"rows": 1, "warps": w} for w in (4, 8, 16, 32)]),
            ("rmsnorm_residual", lambda: op_rmsnorm(big, residual=True), [{"rows": 1, "warps": w} for w in (8, 16, 32)]),
            ("act_quant", lambda: op_act_quant(big),
             [{"groups": g, "warps": w} for g in (8, 16, 32, 64) for w in (2, 4, 8) if g * 128 // (w * 32) >= 4]
             + [{"groups": 64, "warps": 16}]),
            ("silu_mul", lambda: op_silu_mul(big // 2),
             [{"block": b, "warps": w} for b in (1024, 2048, 4096) for w in (4, 8)]),
            ("silu_mul_quant", lambda: op_silu_mul(big // 2, quant=True),
             [{"groups": g, "warps": w} for g in (4, 8, 16, 32) for w in (4, 8) if g * 128 // (w * 32) >= 4]),
            ("rope", lambda: op_rope(big // 2), [{"block": b, "warps": w} for b in (16, 32, 64, 128) for w in (2, 4, 8)]),
            ("weight_dequant", lambda: op_weight_dequant(128 if ARGS.smoke else 18432),
             [{"tile_n": t, "warps": w} for t in (16, 32, 64, 128) for w in (4, 8)]),
        ]
        for name, make, tunes in grids:
            if ONLY and name not in ONLY:
                continue
            try:
                case = make()
                for tune in (tunes[:1] if ARGS.smoke else tunes):
                    if left() < 25:
                        RESULTS["notes"].append(f"budget: skipped variants of {name} from {tune}")
                        break
                    ms = bench_ms(lambda: case["triton"](tune))
                    gbs = case["bytes"] / (ms * 1e6)
                    RESULTS["variants"].append({"op": name, "shape": case["shape"], "tune": tune, "us": ms * 1e3,
                                                "gbs": gbs, "pct": 100 * gbs / ceiling})
                    say(f"{name} {case['shape']} {tune}: {ms * 1e3:.1f} us {gbs:.0f} GB/s {100 * gbs / ceiling:.0f}%")
                del case
            except Exception:
                RESULTS["notes"].append(f"variants {name}: {traceback.format_exc()}")
                section_error(f"variants {name}", traceback.format_exc())
            save()

    # 5. torch.compile of each reference at the prefill size (static shapes; it gets what budget is left)
    if not ARGS.no_compile:
        section("torch.compile at the prefill size")
        for name, make, sizes in BENCH[:1] if ARGS.smoke else BENCH:  # smoke: the section runs, once
            r = COMPILE_ROWS.get(name, sizes[-1])
            rec = next((b for b in RESULTS["bench"] if b["op"] == name and b["rows"] == r and "triton_us" in b), None)
            if rec is None or left() < 30:
                RESULTS["notes"].append(f"torch.compile {name}: skipped (budget or no triton result)")
                continue
            try:
                case = make(r)
                fn = torch.compile(case["ref"])
                t = time.perf_counter()
                fn(*case["args"])
                rec["compile_s"] = time.perf_counter() - t
                rec["compile_us"] = bench_ms(lambda: fn(*case["args"])) * 1e3
                rec["compile_gbs"] = case["bytes"] / (rec["compile_us"] * 1e3)
                rec["compile_pct"] = 100 * rec["compile_gbs"] / ceiling
                say(f"{name} {case['shape']}: compiled in {rec['compile_s']:.0f}s, {rec['compile_us']:.1f} us "
                    f"{rec['compile_gbs']:.0f} GB/s ({rec['compile_pct']:.0f}%)")
                del case, fn
            except Exception:
                rec["compile_error"] = traceback.format_exc()
                section_error(f"torch.compile {name}", rec["compile_error"])
            save()

    # 6. the compiler's report: registers and spills per compiled kernel
    section("compiler report")
    mods = {"rmsnorm": rmsnorm._rmsnorm_kernel, "act_quant": fp8_quant._act_quant_kernel,
            "act_dequant": fp8_quant._act_dequant_kernel, "weight_dequant": fp8_quant._weight_dequant_kernel,
            "rope": rope._rope_kernel, "silu_mul": silu_mul._silu_mul_kernel,
            "silu_mul_quant": silu_mul._silu_mul_quant_kernel, "anchor": _ds_act_quant_kernel}
    for name, fn in mods.items():
        try:
            for cache in getattr(fn, "device_caches", {}).values():
                for k in cache[0].values():
                    rep = {"kernel": name, "n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None),
                           "num_warps": getattr(k.metadata, "num_warps", None), "shared": getattr(k.metadata, "shared", None)}
                    RESULTS["compiler"].append(rep)
                    ptx = getattr(k, "asm", {}).get("ptx") if name in ("rope", "act_quant", "rmsnorm") else None
                    if ptx and not os.path.exists(os.path.join(ARGS.out, f"{name}.ptx")):
                        with open(os.path.join(ARGS.out, f"{name}.ptx"), "w") as f:
                            f.write(ptx)
        except Exception as exc:
            RESULTS["notes"].append(f"compiler report {name}: {exc!r}")
    spills = [c for c in RESULTS["compiler"] if c.get("n_spills")]
    say(f"{len(RESULTS['compiler'])} compiled kernels; with spills: {spills or 'none'}")
    save()

    # 7. the short table, last
    section("summary")
    say(f"copy ceiling: {ceiling:.0f} GB/s")
    n_pass = sum(r.passed for r in rows)
    say(f"parity on {DEV}: {n_pass}/{len(rows)} checks passed"
        + ("" if n_pass == len(rows) else "; FAILED: " + ", ".join(r.name() for r in rows if not r.passed)[:800]))
    hdr = f"{'op':<17}{'shape':<24}{'triton':>12}{'%ceil':>7}{'eager':>12}{'compile':>12}{'x eager':>9}{'x comp':>8}"
    say(hdr)
    for rec in RESULTS["bench"]:
        if "triton_gbs" not in rec or rec["rows"] < 1024:
            continue
        comp = rec.get("compile_gbs")
        say(f"{rec['op']:<17}{rec['shape']:<24}{rec['triton_gbs']:>8.0f}GB/s{rec['triton_pct']:>6.0f}%"
            f"{rec['eager_gbs']:>8.0f}GB/s" + (f"{comp:>8.0f}GB/s" if comp else f"{'-':>12}")
            + f"{rec['eager_us'] / rec['triton_us']:>8.2f}x" + (f"{rec['compile_us'] / rec['triton_us']:>7.2f}x" if comp else f"{'-':>8}"))
    for name, _, sizes in BENCH:  # the target: >= 90 % of the copy ceiling at the largest (prefill) size
        rec = next((b for b in RESULTS["bench"] if b["op"] == name and b["rows"] == sizes[-1] and "triton_pct" in b), None)
        if rec:
            miss = 90.0 - rec["triton_pct"]
            say(f"target {name} {rec['shape']}: {rec['triton_pct']:.0f}% of copy "
                + ("MET" if miss <= 0 else f"MISSED by {miss:.0f} points"))
    say("decode latency (us; do_bench / CUDA-graph replay):")
    for rec in RESULTS["bench"]:
        if "triton_us" in rec and rec["rows"] <= DECODE_MAX:
            g = f" graph {rec['triton_graph_us']:.1f} vs {rec['eager_graph_us']:.1f}" if "triton_graph_us" in rec else ""
            say(f"  {rec['op']:<17}{rec['shape']:<24} triton {rec['triton_us']:.1f} vs eager {rec['eager_us']:.1f}{g}")
    for rec in RESULTS["bench"]:
        if "alt_gbs" in rec and rec["rows"] >= 4096:
            say(f"{rec['op']} {rec['shape']}: {rec['alt']} {rec['alt_gbs']:.0f} GB/s ({rec['alt_pct']:.0f}%) "
                f"vs ours {rec['triton_gbs']:.0f} GB/s ({rec['triton_pct']:.0f}%)")
    for rec in RESULTS["bench"]:
        if "anchor_gbs" in rec and rec["rows"] >= 4096:
            say(f"anchor act_quant one-block-per-program {rec['shape']}: {rec['anchor_gbs']:.0f} GB/s "
                f"({rec['anchor_pct']:.0f}%) vs ours {rec['triton_gbs']:.0f} GB/s ({rec['triton_pct']:.0f}%)")
    best: dict = {}
    for v in RESULTS["variants"]:
        if v["op"] not in best or v["gbs"] > best[v["op"]]["gbs"]:
            best[v["op"]] = v
    for v in best.values():
        say(f"best variant {v['op']} {v['shape']}: {v['tune']} {v['gbs']:.0f} GB/s ({v['pct']:.0f}%)")
    say(f"total {time.perf_counter() - T0:.0f}s")
    if ERRORS:
        say("section errors: " + "; ".join(ERRORS))
    save()
    return 0 if n_pass == len(rows) and not ERRORS else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        save()
