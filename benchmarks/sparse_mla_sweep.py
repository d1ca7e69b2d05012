#!/usr/bin/env python3
# ruff: noqa: E402  (torch is imported after the interpreter switch)
"""Sparse MLA decode over the 584-byte pool: launch-config variants, each parity-checked against the
reference at the measured shape, timed at b32/b64/b128 (V4-Flash: 64 heads, window 128 + top-512 = 640
slots per row) as % of the copy ceiling measured in the same run.

    PYTHONPATH=. python3 benchmarks/sparse_mla_sweep.py --out DIR            # on a CUDA machine
    PYTHONPATH=. python3 benchmarks/sparse_mla_sweep.py --warm NAME          # compile one variant (cache)
    python benchmarks/sparse_mla_sweep.py --smoke                             # tiny sizes, CPU interpreter

Bytes counted (as benchmarks/v4_bench.py): the pool rows read (584 per slot), q and out, the indices.
Flops counted: per slot of a row, every head's score (512 × 2) and value (512 × 2) work, 64 heads × 2048
≈ 131 kflop on 584 bytes ≈ 224 flop/B, about the H200's ridge (dense bf16 / copy). So each row also
gives the compute-bound time at the dense bf16 matmul peak measured in the same run (torch.matmul,
8192³), the memory-bound time at the copy ceiling, and the kernel's share of each and of the larger.
``--warm`` runs a variant at a small size in both launch shapes (split and unsplit) so a parallel set of
processes fills Triton's cache before the timed process starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for sparse_mla_sweep.{json,txt}")
ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU under the Triton interpreter")
ap.add_argument("--warm", default="", help="compile (and check) this variant only, then exit")
ap.add_argument("--variants", default="", help="comma list of variant names (default: all)")
ap.add_argument("--batches", default="32,64,128")
ap.add_argument("--budget", type=float, default=45.0, help="seconds; later variants are skipped past it")
ARGS = ap.parse_args()
os.environ["TRITON_INTERPRET"] = "1" if ARGS.smoke else "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses

import torch
import triton

from kernels import kv584, sparse_mla
from kernels.metrics import gemm_diff

T0 = time.perf_counter()
DEV = "cpu" if ARGS.smoke else "cuda"
HEADS = 16 if ARGS.smoke else 64
K = 40 if ARGS.smoke else 640
PAGES = 1 if ARGS.smoke else 4096
SMS = 132 if ARGS.smoke else torch.cuda.get_device_properties(0).multi_processor_count


def _split(b: int, bt: int, factor: float = 1.0) -> int:
    return max(1, min(int(factor * SMS) // max(1, b), triton.cdiv(K, bt)))


def variant(name: str, b: int) -> sparse_mla.SparseConfig | None:
    """The config a named variant uses at batch ``b`` (None: the library's default, :func:`sparse_config`)."""
    if name == "default":
        return None
    spec = VARIANTS[name]
    if ARGS.smoke:  # interpreter-sized tiles, the variant's code path
        return sparse_mla.SparseConfig(16, 16, 2, 1, prefetch=spec.get("prefetch", True), xchg=spec.get("xchg", False),
                                       fused_combine=spec.get("fused_combine", False))
    bt, bh = spec["block_t"], spec.get("block_h", 64)
    n = _split(b * triton.cdiv(HEADS, bh), bt, spec.get("waves", 1.0))
    knobs = {k: v for k, v in spec.items() if k not in ("block_t", "block_h", "waves", "num_warps", "num_stages")}
    return sparse_mla.SparseConfig(bh, bt, n, spec.get("num_warps", 8), spec.get("num_stages", 1), **knobs)


def decode_fn(name: str, b: int):
    """``fn(pool=, q=, indices=, sinks=, scale=, out=)`` for a variant; ``old`` is the module at
    ``$SPARSE_MLA_OLD`` (an earlier kernel, for a before/after in one run)."""
    if name == "old":
        import importlib.util

        spec = importlib.util.spec_from_file_location("sparse_mla_old", os.environ["SPARSE_MLA_OLD"])
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.sparse_mla_decode
    cfg = variant(name, b)
    return lambda **kw: sparse_mla.sparse_mla_decode(**kw, config=cfg)


X64E = {"block_t": 64, "prefetch": False, "xchg": True, "lazy": False}
GLUON = {"block_t": 64, "gluon": True, "num_stages": 2}
WS = {"block_t": 64, "gluon": True, "warp_spec": True, "lazy": False}  # the warp-specialised kernel, eager rescale
VARIANTS: dict[str, dict] = {  # in the order they are timed (a run short of time drops the last)
    "g2-l2": {**GLUON, "l2_prefetch": 1},
    "g2-ia": {**GLUON, "l2_prefetch": 1, "idx_ahead": True},
    "g2-fu": {**GLUON, "l2_prefetch": 1, "fused_combine": True},
    "g2-qa": {**GLUON, "l2_prefetch": 1, "q_async": True},
    "g2-all": {**GLUON, "l2_prefetch": 1, "idx_ahead": True, "fused_combine": True, "q_async": True},
    "g2-iafu": {**GLUON, "l2_prefetch": 1, "idx_ahead": True, "fused_combine": True},
    "g2-cf": {**GLUON, "l2_prefetch": 1, "idx_ahead": True, "fused_combine": True, "q_async": True, "row_warps": True},
    "g2-cf-e2": {**GLUON, "l2_prefetch": 1, "idx_ahead": True, "fused_combine": True, "q_async": True, "row_warps": True,
                 "early_parts": 2},
    "g2-all-e2": {**GLUON, "l2_prefetch": 1, "idx_ahead": True, "fused_combine": True, "q_async": True, "early_parts": 2},
    "wsk2": {**WS, "num_stages": 2, "l2_prefetch": 1, "score_split": True},
    "wsk2-lz": {**WS, "num_stages": 2, "l2_prefetch": 1, "score_split": True, "lazy": True},
    "wsk2-ia": {**WS, "num_stages": 2, "l2_prefetch": 1, "score_split": True, "idx_ahead": True},
    "wsp1-ia": {**WS, "num_stages": 1, "l2_prefetch": 1, "score_split": True, "producers": 2, "idx_ahead": True},
    "wsk3": {**WS, "num_stages": 3, "l2_prefetch": 1, "score_split": True},
    "wsp1": {**WS, "num_stages": 1, "l2_prefetch": 1, "score_split": True, "producers": 2},
    "wsp1-fu": {**WS, "num_stages": 1, "l2_prefetch": 1, "score_split": True, "producers": 2, "fused_combine": True},
    "ws3": {**WS, "num_stages": 3, "l2_prefetch": 1},
    "g2": GLUON,
    "g2-bf16": {**GLUON, "part_bf16": True},
    "g2-half": {**GLUON, "waves": 0.5},
    "g2-e2": {**GLUON, "early_parts": 2},
    "g2-w": {**GLUON, "wg_sums": True},
    "x64e-l2": {**X64E, "l2_prefetch": 1},
    "x64e-l2d2": {**X64E, "l2_prefetch": 2},
    "x64e-l2-fu": {**X64E, "l2_prefetch": 1, "fused_combine": True},
    "x64e-fu": {**X64E, "fused_combine": True},
    "x64e-jit": {**X64E, "fast_launch": False},
    "x64e-fu-bf16": {**X64E, "fused_combine": True, "part_bf16": True},
    "x64e-ipf": {**X64E, "idx_prefetch": True},
    "x32e": {**X64E, "block_t": 32},
    "x64e-x2": {**X64E, "waves": 2.0},
    "bt64-st2-eager": {"block_t": 64, "prefetch": False, "num_stages": 2, "lazy": False},
    "x64": {"block_t": 64, "prefetch": False, "xchg": True},
    "bt64-st2": {"block_t": 64, "prefetch": False, "num_stages": 2},
}
NAMES = ["default", "x64e-fu"] if ARGS.smoke else ["default", *VARIANTS]
if os.environ.get("SPARSE_MLA_OLD"):
    NAMES.insert(1, "old")
if ARGS.variants:
    NAMES = ARGS.variants.split(",")
LINES: list[str] = []
RESULTS: dict = {"device": DEV, "ceiling_gbs": None, "peak_tflops": None, "rows": [], "errors": []}


def say(s: str = "") -> None:
    print(s, flush=True)
    LINES.append(s)


def bench_ms(fn) -> float:
    if DEV == "cpu":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")


_FLUSH: dict = {}


def gpu_ms(fn, reps: int = 15, clean: bool = False) -> float:
    """Device time alone: L2 flushed, then a spin kernel keeps the GPU busy while the host enqueues ``fn``
    (do_bench's number also holds host time whenever the launch path is slower than its L2 flush).
    do_bench flushes by writing 256 MB, so the call starts with an L2 full of dirty lines to write back;
    ``clean`` flushes by reading them instead (an L2 of clean lines, as after another kernel's reads)."""
    if DEV == "cpu":
        return bench_ms(fn)
    if "buf" not in _FLUSH:
        _FLUSH["buf"] = torch.empty(256 << 20, dtype=torch.uint8, device=DEV)
    times = []
    for _ in range(reps):
        if clean:
            _FLUSH["sum"] = _FLUSH["buf"].sum(dtype=torch.int64)
        else:
            _FLUSH["buf"].zero_()
        torch.cuda._sleep(1_000_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def host_us(fn, reps: int = 20) -> float:
    """Host time of one call (the GPU kept busy by a spin kernel, so nothing waits on it)."""
    if DEV == "cpu":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    dt = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize()
    return dt


def make_pool(pages: int = PAGES) -> tuple[torch.Tensor, int]:
    n = pages * 64
    gen = torch.Generator(DEV).manual_seed(0)
    pool = kv584.new_pool(pages, 64, DEV)
    pool.view(n, -1)[:] = kv584.pack_ref(torch.randn(n, 512, device=DEV, generator=gen))
    return pool, n


def inputs(b: int, n: int, seed: int) -> dict:
    gen = torch.Generator(DEV).manual_seed(seed)
    idx = torch.randint(0, n, (b, K), device=DEV, dtype=torch.int32, generator=gen)
    idx[:, -7:] = -1  # a few empty slots, as a short window leaves
    q = (torch.randn(b, HEADS, 512, device=DEV, generator=gen) * 0.5).bfloat16()
    sinks = torch.randn(HEADS, device=DEV, generator=gen)
    return {"q": q, "indices": idx, "sinks": sinks, "scale": 512 ** -0.5}


def warm(name: str) -> None:
    pool, n = make_pool(min(PAGES, 64))
    for b, n_split in ((2, 2), (2, 1)):
        inp = inputs(b, n, 1)
        cfg = variant(name, 32) if name != "old" else None
        if name == "default":
            cfg = sparse_mla.sparse_config(32, HEADS, K, None if ARGS.smoke else (9, 0), True, SMS)
        if cfg is not None:
            cfg = dataclasses.replace(cfg, n_split=n_split)
        if name == "old":
            out = decode_fn(name, b)(pool=pool, **inp)
        else:
            out = sparse_mla.sparse_mla_decode(pool=pool, **inp, config=cfg)
        ref = sparse_mla.sparse_mla_decode_ref(pool=pool, **inp)
        print(f"warm {name} split={n_split}: gemm_diff {gemm_diff(out, ref).value:.2e}", flush=True)
    mod = sys.modules.get("sparse_mla_old") if name == "old" else sparse_mla
    for kname in ("_sparse_decode_kernel", "_sparse_decode_gluon", "_sparse_decode_ws"):
        for line in kernel_info(getattr(mod, kname, None)):
            print(f"warm {name} {kname} {line}", flush=True)


def kernel_info(fn) -> list[str]:
    """Registers, spills and shared memory of each compiled specialisation of ``fn`` (best effort: the
    cache's shape differs between Triton versions)."""
    rows = []
    try:
        for caches in fn.device_caches.values():
            for k in caches[0].values():
                rows.append(f"regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')} "
                            f"smem {getattr(k.metadata, 'shared', '?')} warps {getattr(k.metadata, 'num_warps', '?')} "
                            f"stages {getattr(k.metadata, 'num_stages', '?')}")
    except Exception as exc:  # diagnostics only
        rows.append(f"no kernel info: {exc!r}")
    return rows


def ceiling() -> None:
    nb = (1 << 16) if ARGS.smoke else (1 << 30)
    src = torch.empty(nb, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    RESULTS["ceiling_gbs"] = 2 * nb / ms / 1e6
    say(f"copy ceiling: {RESULTS['ceiling_gbs']:.0f} GB/s (read + write of {nb >> 20} MiB)")


def matmul_peak() -> None:
    """Dense bf16 tensor-core peak of this GPU as torch.matmul reaches it (8192³; fp32 on CPU)."""
    n = 256 if ARGS.smoke else 8192
    dt = torch.float32 if ARGS.smoke else torch.bfloat16
    a = torch.randn(n, n, device=DEV, dtype=dt)
    b = torch.randn(n, n, device=DEV, dtype=dt)
    c = torch.empty(n, n, device=DEV, dtype=dt)
    ms = bench_ms(lambda: torch.matmul(a, b, out=c))
    RESULTS["peak_tflops"] = 2 * n ** 3 / ms / 1e9
    say(f"dense {'fp32' if ARGS.smoke else 'bf16'} matmul peak: {RESULTS['peak_tflops']:.0f} TFLOP/s "
        f"(torch.matmul {n}^3); ridge {RESULTS['peak_tflops'] * 1e12 / (RESULTS['ceiling_gbs'] * 1e9):.0f} flop/B")


def flops(b: int) -> float:
    """Score and value work of a call: every head, every slot (512-wide dots, 2 flops a multiply-add)."""
    return b * K * HEADS * 512 * 2 * 2


def bounds(b: int, nbytes: int) -> tuple[float, float]:
    """(compute-bound us at the measured matmul peak, memory-bound us at the copy ceiling)."""
    return flops(b) / (RESULTS["peak_tflops"] * 1e6), nbytes / (RESULTS["ceiling_gbs"] * 1e3)


def roofline_table() -> None:
    """Per batch: both bounds and the best measured variant's share of each (and of the larger)."""
    say()
    say(f"roofline (same run: copy {RESULTS['ceiling_gbs']:.0f} GB/s, dense bf16 {RESULTS['peak_tflops']:.0f} "
        f"TFLOP/s); flop/B of the call in brackets")
    say(f"{'batch':>5} {'MB':>7} {'GFLOP':>7} {'mem us':>7} {'mma us':>7} {'bound':>7} {'best':<14} {'us':>7} "
        f"{'% mem':>6} {'% mma':>6} {'% max':>6}")
    for b in sorted({r["batch"] for r in RESULTS["rows"]}):
        rows = [r for r in RESULTS["rows"] if r["batch"] == b]
        best = min(rows, key=lambda r: r["ms"])
        tm, tc = best["mem_us"], best["mma_us"]
        us = best["ms"] * 1e3
        say(f"{b:>5} {best['bytes'] / 1e6:7.1f} {flops(b) / 1e9:7.2f} {tm:7.1f} {tc:7.1f} {max(tm, tc):7.1f} "
            f"{best['variant']:<14} {us:7.1f} {100 * tm / us:5.1f}% {100 * tc / us:5.1f}% "
            f"{100 * max(tm, tc) / us:5.1f}%   [{flops(b) / best['bytes']:.0f} flop/B]"
            f"  row gather alone {RESULTS.get('gather_us', {}).get(b, float('nan')):.1f} us")


def sweep() -> None:
    pool, n = make_pool()
    batches = [2] if ARGS.smoke else [int(x) for x in ARGS.batches.split(",")]
    cases = {b: inputs(b, n, b) for b in batches}
    refs = {b: sparse_mla.sparse_mla_decode_ref(pool=pool, **cases[b]) for b in batches}
    rows = pool.view(-1, kv584.TOKEN_BYTES)
    for b in batches:  # a plain gather of the same rows (index_select): what random 584-byte rows cost here
        sel = cases[b]["indices"].reshape(-1).clamp(min=0).long()
        dst = torch.empty(sel.numel(), kv584.TOKEN_BYTES, dtype=torch.uint8, device=DEV)
        ms = bench_ms(lambda sel=sel, dst=dst: torch.index_select(rows, 0, sel, out=dst))
        RESULTS.setdefault("gather_us", {})[b] = ms * 1e3
        say(f"row gather b{b}: {ms * 1e3:.1f} us for {sel.numel()} rows (read + write {2 * dst.numel() / ms / 1e6:.0f} GB/s, "
            f"{100 * 2 * dst.numel() / ms / 1e6 / RESULTS['ceiling_gbs']:.0f} % of copy)")
    say("us: do_bench (as benchmarks/v4_bench.py); gpu us: device time alone; host us: the call's host side")
    say("% mma: the compute-bound time (flops at the matmul peak) over the kernel's; % max: the larger bound's")
    say("clean us: device time after an L2 flush by reading (do_bench's flush writes: dirty lines to write back)")
    say(f"{'variant':<14} {'batch':>5} {'split':>5} {'us':>8} {'% copy':>7} {'% mma':>6} {'% max':>6} "
        f"{'gpu us':>8} {'% copy':>7} {'host us':>8} {'gemm_diff':>10} {'clean us':>8} {'% copy':>7}")
    for name in NAMES:
        for b in batches:
            if time.perf_counter() - T0 > ARGS.budget:
                say(f"{name} b{b}: skipped (budget)")
                continue
            try:
                inp = cases[b]
                cfg = variant(name, b) if name != "old" else None
                fn = decode_fn(name, b)
                out = torch.empty_like(inp["q"])
                fn(pool=pool, **inp, out=out)
                diff = gemm_diff(out, refs[b]).value
                if not diff <= 2e-5:  # parity first: a variant off the reference is not timed
                    RESULTS["errors"].append({"variant": name, "batch": b, "error": f"gemm_diff {diff:.2e}"})
                    say(f"{name:<14} {b:>5} parity FAIL: gemm_diff {diff:.2e} > 2e-5 (not timed)")
                    continue
                ms = bench_ms(lambda inp=inp, out=out, fn=fn: fn(pool=pool, **inp, out=out))
                nbytes = b * K * kv584.TOKEN_BYTES + 2 * inp["q"].numel() * 2 + inp["indices"].numel() * 4
                g = nbytes / ms / 1e6
                gms = gpu_ms(lambda inp=inp, out=out, fn=fn: fn(pool=pool, **inp, out=out))
                hus = host_us(lambda inp=inp, out=out, fn=fn: fn(pool=pool, **inp, out=out))
                cms = gpu_ms(lambda inp=inp, out=out, fn=fn: fn(pool=pool, **inp, out=out), clean=True)
                gg = nbytes / gms / 1e6
                ceil = RESULTS["ceiling_gbs"] or float("nan")
                used = cfg or sparse_mla.sparse_config(b, HEADS, K, None if ARGS.smoke else (9, 0), True, SMS)
                if name == "old":
                    used = sparse_mla.SparseConfig(16, 16, 0, 4)
                tc, tm = bounds(b, nbytes)
                RESULTS["rows"].append({"variant": name, "batch": b, "config": dataclasses.asdict(used), "ms": ms,
                                        "gbs": g, "of_ceiling": g / ceil, "gpu_ms": gms, "gpu_of_ceiling": gg / ceil,
                                        "host_us": hus, "gemm_diff": diff, "bytes": nbytes, "mem_us": tm,
                                        "mma_us": tc, "of_mma": tc / (ms * 1e3), "of_bound": max(tm, tc) / (ms * 1e3),
                                        "clean_ms": cms, "clean_of_ceiling": nbytes / cms / 1e6 / ceil})
                say(f"{name:<14} {b:>5} {used.n_split:>5} {ms * 1e3:8.1f} {100 * g / ceil:6.1f}% "
                    f"{100 * tc / (ms * 1e3):5.1f}% {100 * max(tm, tc) / (ms * 1e3):5.1f}% {gms * 1e3:8.1f} "
                    f"{100 * gg / ceil:6.1f}% {hus:8.1f} {diff:10.2e} {cms * 1e3:8.1f} {100 * nbytes / cms / 1e6 / ceil:6.1f}%")
                save()
            except Exception as exc:  # one broken variant must not hide the others
                RESULTS["errors"].append({"variant": name, "batch": b, "error": repr(exc)})
                say(f"section error {name} b{b}: {exc!r}"[:400])
                traceback.print_exc()


def save() -> None:
    """Written after every row: a run cut short by its time limit keeps what it measured."""
    os.makedirs(ARGS.out, exist_ok=True)
    with open(os.path.join(ARGS.out, "sparse_mla_sweep.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
    with open(os.path.join(ARGS.out, "sparse_mla_sweep.txt"), "w") as f:
        f.write("\n".join(LINES) + "\n")


def main() -> int:
    if ARGS.warm:
        warm(ARGS.warm)
        return 0
    ceiling()
    matmul_peak()
    sweep()
    if RESULTS["rows"]:
        roofline_table()
    say(f"done in {time.perf_counter() - T0:.1f} s")
    save()
    return 1 if RESULTS["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
