#!/usr/bin/env python3
# ruff: noqa: E402  (torch and the kernels are imported after the interpreter switch)
"""DeepSeek-V4 kernels and engine in one run: the copy ceiling, the memory-bound V4 kernels as % of it,
sparse MLA decode over the 584-byte FP8 pool at batch ≥ 32 as % of it, and tiny/small V4 engine decode
tok/s (torch and Triton paths) against HF transformers' DeepseekV4ForCausalLM.

    PYTHONPATH=. python3 benchmarks/v4_bench.py --out DIR        # on a CUDA machine
    python benchmarks/v4_bench.py --smoke                         # tiny sizes on CPU: every section runs

Bytes counted are the fewest an op must move (each input read once, each output written once); the
pool's bytes per token come from the profile table below. kv584_store, kv584_load and compress_store also print
their time against a copy of the same bytes (the ceiling at that size), hc_pre its % of the two-pass bound (x read
twice), sparse decode its dots' TFLOP/s against a bf16 GEMM's in the same run. Each kernel row also prints its
graphed device time (CUDA graph replay behind an L2 flush, the flush subtracted), which leaves out the host's
launch cost that events around an eager call count at small shapes.
Exits non-zero if any section raised.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for v4_bench.{json,txt}")
ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU under the Triton interpreter")
ap.add_argument("--sections", default="ceiling,membound,sparse,engine,decode,compress_parts")
ap.add_argument("--budget", type=float, default=400.0, help="seconds; later sections are skipped past it")
ARGS = ap.parse_args()
os.environ["TRITON_INTERPRET"] = "1" if ARGS.smoke else "0"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from kernels import compressor, hc, kv584, mxfp4, sparse_mla

DEV = "cpu" if ARGS.smoke else "cuda"
T0 = time.perf_counter()
RESULTS: dict = {"device": DEV, "ceiling_gbs": None, "membound": [], "sparse": [], "engine": [], "decode": [],
                 "errors": []}
LINES: list[str] = []

# Profile table: bytes one cached token occupies per KV layout (what decode reads per attended token).
KV_BYTES_PER_TOKEN = {"kv584": 584, "bf16": 1024, "fp32": 2048}


def say(s: str = "") -> None:
    print(s, flush=True)
    LINES.append(s)


def bench_ms(fn) -> float:
    if DEV == "cpu":
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def graph_ms(fn, reps: int = 25) -> float | None:
    """Device time alone: ``fn`` captured in a CUDA graph behind an L2 flush, replayed, less the flush's own
    graph. ``bench_ms``'s events also count the host's launch cost where it outlasts the GPU's queue (small
    shapes); a graphed decode step does not pay it. None on CPU or where ``fn`` cannot be captured."""
    if DEV == "cpu":
        return None
    flush = torch.empty(256 << 20, dtype=torch.int8, device=DEV)  # far past the 50-60 MB L2
    try:
        fn()
        torch.cuda.synchronize()
        g_flush, g_both = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_flush):
            flush.zero_()
        with torch.cuda.graph(g_both):
            flush.zero_()
            fn()
    except Exception:  # a wrapper that syncs or reads a device value cannot be captured
        torch.cuda.synchronize()
        return None

    def median_ms(g) -> float:
        g.replay()
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        return sorted(a.elapsed_time(b) for a, b in ev)[reps // 2]

    return max(1e-6, median_ms(g_both) - median_ms(g_flush))


def gbs(nbytes: float, ms: float) -> float:
    return nbytes / ms / 1e6


def sec_ceiling() -> None:
    n = (1 << 16) if ARGS.smoke else (1 << 30)  # 1 GiB: far past L2
    src = torch.empty(n, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    RESULTS["ceiling_gbs"] = gbs(2 * n, ms)
    say(f"copy ceiling: {RESULTS['ceiling_gbs']:.0f} GB/s (read + write of {n >> 20} MiB)")


def _row(name: str, shape: str, nbytes: float, fn, key: str, *, same_copy_ms: float | None = None,
         two_pass_bytes: float | None = None) -> None:
    """One result line for ``fn`` timed by ``bench_ms`` (the % of copy) and by ``graph_ms`` (device time
    alone, with its % of copy); ``same_copy_ms``: a device copy of the op's bytes timed the same way (the
    ceiling at that size); ``two_pass_bytes``: the bytes of a design that must read its input twice."""
    ms = bench_ms(fn)
    g = gbs(nbytes, ms)
    ceil = RESULTS["ceiling_gbs"] or float("nan")
    gms = graph_ms(fn)
    rec = {"op": name, "shape": shape, "ms": ms, "gbs": g, "of_ceiling": g / ceil, "graph_ms": gms,
           "graph_of_ceiling": gbs(nbytes, gms) / ceil if gms else None}
    tail = f"  (graphed {gms * 1e3:.1f} us: {100 * gbs(nbytes, gms) / ceil:.1f} %)" if gms else ""
    if same_copy_ms is not None:
        rec["of_same_size_copy"] = same_copy_ms / ms
        tail += f"  ({100 * same_copy_ms / ms:.1f} % of a same-size copy, {same_copy_ms * 1e3:.1f} us)"
    if two_pass_bytes is not None:
        rec["two_pass_of_ceiling"] = gbs(two_pass_bytes, ms) / ceil
        tail += f"  (two-pass bound, x read twice, {two_pass_bytes / 1e6:.0f} MB: {100 * rec['two_pass_of_ceiling']:.1f} %)"
    RESULTS[key].append(rec)
    say(f"{name:<18} {shape:<26} {ms * 1e3:9.1f} us {g:8.0f} GB/s {100 * g / ceil:6.1f} % of copy{tail}")


def _copy_ms(nbytes: float) -> float:
    """do_bench of a device copy moving ``nbytes`` (half read, half written)."""
    a = torch.empty(int(nbytes // 2), dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    return bench_ms(lambda: b.copy_(a))


def sec_membound() -> None:
    say("\nmemory-bound V4 kernels (bytes: each input read once, each output written once)")
    for tok in ((16,) if ARGS.smoke else (65536, 262144)):  # 105 MB and 420 MB moved: the second fills the GPU
        kv = torch.randn(tok, kv584.HEAD_DIM, device=DEV).bfloat16()
        pool = kv584.new_pool(-(-tok // 64), 64, DEV)
        slots = torch.arange(tok, device=DEV)
        nb = tok * (kv584.HEAD_DIM * 2 + kv584.TOKEN_BYTES)
        _row("kv584_store", f"{tok} tok", nb,
             lambda kv=kv, pool=pool, slots=slots: kv584.kv584_store(kv, pool, slots), "membound",
             same_copy_ms=_copy_ms(nb))
        if tok == 65536 or ARGS.smoke:
            pool_65k, slots_65k = pool, slots  # the load below reads these rows back
    pool, slots = pool_65k, slots_65k
    tok = slots.shape[0]
    out = torch.empty(tok, kv584.HEAD_DIM, device=DEV)
    nb = tok * (kv584.TOKEN_BYTES + kv584.HEAD_DIM * 4)
    _row("kv584_load", f"{tok} tok -> fp32", nb, lambda: kv584.kv584_load(pool, slots, out=out), "membound",
         same_copy_ms=_copy_ms(nb))
    t, n, d = (2, 4, 64) if ARGS.smoke else (8192, 4, 4096)
    x = torch.randn(t, n, d, device=DEV).bfloat16()
    fn = torch.randn((2 + n) * n, n * d, device=DEV) * (n * d) ** -0.5
    base, scale = torch.zeros((2 + n) * n, device=DEV), torch.ones(3, device=DEV)
    # x read once (bf16), fn read once; out: col (bf16), post and comb (fp32). The split design reads x twice
    # (logits, then the collapse once the weights are known): that bound is printed beside it
    once = t * n * d * 2 + t * d * 2 + t * (n + n * n) * 4 + fn.numel() * 4
    _row("hc_pre", f"{t}x{n}x{d}", once, lambda: hc.hc_pre(x, fn, base, scale, 20, 1e-6, 1e-6), "membound",
         two_pass_bytes=once + t * n * d * 2)
    _, post, comb = hc.hc_pre_ref(x[:1].float(), fn, base, scale, 20, 1e-6, 1e-6)
    post, comb = post.expand(t, n).contiguous(), comb.expand(t, n, n).contiguous()
    o = torch.randn(t, d, device=DEV).bfloat16()
    y = torch.empty_like(x)
    _row("hc_post", f"{t}x{n}x{d}", t * (n * d * 2 * 2 + d * 2), lambda: hc.hc_post(o, x, post, comb, out=y),
         "membound")
    e, rows, k = (1, 16, 128) if ARGS.smoke else (16, 4096, 4096)
    w = torch.randint(0, 256, (e, rows, k // 2), device=DEV, dtype=torch.int32).to(torch.uint8).view(torch.int8)
    s = torch.randint(120, 134, (e, rows, k // 32), device=DEV, dtype=torch.int32).to(torch.uint8)
    s = s.view(torch.float8_e8m0fnu)
    dq = torch.empty(e, rows, k, dtype=torch.bfloat16, device=DEV)
    _row("mxfp4_dequant", f"{e}x{rows}x{k} -> bf16", w.numel() + s.numel() + dq.numel() * 2,
         lambda: mxfp4.mxfp4_dequant(w, s, torch.bfloat16, out=dq), "membound")
    # CSA (window 8) at 4096 entries (100 MB: two waves of programs) and 16384 (400 MB), HCA (window 128) at 1024;
    # then HCA at V4-Flash prefills of 64K and 16K tokens (one entry per 128 tokens: 512 and 128 entries, fewer
    # programs than the GPU holds, the case split windows are for)
    sizes = ((2, 8), (2, 16)) if ARGS.smoke else ((4096, 8), (16384, 8), (1024, 128), (512, 128), (128, 128))
    for n_ent, length in sizes:
        a, nb = _compress_inputs(n_ent, length)
        _row("compress_store", f"{n_ent} entries x {length}", nb, lambda a=a: compressor.compress_store(*a),
             "membound", same_copy_ms=_copy_ms(nb))
        del a


def _compress_inputs(n_ent: int, length: int) -> tuple[tuple, int]:
    """compress_store's arguments for ``n_ent`` windows of ``length`` rows, and the bytes it moves."""
    ckv = torch.randn(n_ent, length, 512, device=DEV).bfloat16()
    cg = torch.randn(n_ent, length, 512, device=DEV)
    cos, sin = torch.ones(n_ent, 32, device=DEV), torch.zeros(n_ent, 32, device=DEV)
    pool = kv584.new_pool(-(-n_ent // 64), 64, DEV)
    args = (ckv, cg, torch.ones(512, device=DEV), 1e-6, cos, sin, pool, torch.arange(n_ent, device=DEV))
    return args, n_ent * (length * 512 * 6 + kv584.TOKEN_BYTES)


def _gemm_peak() -> float:
    """bf16 tensor-core throughput a large square GEMM reaches here, in TFLOP/s: the MMA side of the roofline
    (the score and value dots are 224 flops per pool byte at 64 heads, past the H200's ridge)."""
    m = 64 if ARGS.smoke else 8192
    a = torch.randn(m, m, device=DEV).bfloat16()
    b = torch.randn(m, m, device=DEV).bfloat16()
    ms = bench_ms(lambda: a @ b)
    peak = 2 * m ** 3 / ms / 1e9
    RESULTS["gemm_peak_tflops"] = peak
    say(f"bf16 GEMM {m}^3: {peak:.0f} TFLOP/s")
    return peak


def _mma_floor(rec: dict, nbytes: float, flops: float, peak: float) -> None:
    """What the 70 % bar asks of the MMAs: the TFLOP/s that the row's dots must run at to move its bytes at
    70 % of the copy ceiling, against the GEMM peak; and the row's time against the roofline bound (the longer
    of its bytes at the ceiling and its flops at the peak)."""
    ceil = RESULTS["ceiling_gbs"] or float("nan")
    need = flops / (nbytes / (0.7 * ceil * 1e6)) / 1e9
    bound_ms = max(nbytes / (ceil * 1e6), flops / (peak * 1e9))
    rec.update(tflops=flops / rec["ms"] / 1e9, tflops_for_70=need, of_roofline=bound_ms / rec["ms"])
    say(f"{'':<18} {'':<26} {flops / 1e9:7.1f} GFLOP: runs at {rec['tflops']:.0f} TFLOP/s; 70 % of copy needs "
        f"{need:.0f} TFLOP/s = {100 * need / peak:.0f} % of the GEMM peak; {100 * rec['of_roofline']:.1f} % of the "
        f"roofline bound ({bound_ms * 1e3:.1f} us)")


def sec_sparse() -> None:
    say("\nsparse MLA decode over the 584-byte pool (window 128 + top-512 entries per row; bytes: the pool rows "
        "read, q and out)")
    heads = 16 if ARGS.smoke else 64
    k = 8 if ARGS.smoke else 640
    pages = 1 if ARGS.smoke else 4096
    pool = kv584.new_pool(pages, 64, DEV)
    n = pages * 64
    kv584.kv584_store(torch.randn(n, 512, device=DEV), pool, torch.arange(n, device=DEV))
    peak = _gemm_peak()
    # b256 / b512 read 96 / 191 MB of rows: sizes where a plain copy nears the ceiling (the same-size copy
    # printed beside each row is what is attainable at that size)
    for b in ((2,) if ARGS.smoke else (32, 64, 128, 256, 512)):
        idx = torch.randint(0, n, (b, k), device=DEV, dtype=torch.int32)
        q = torch.randn(b, heads, 512, device=DEV).bfloat16()
        sinks = torch.zeros(heads, device=DEV)
        out = torch.empty_like(q)
        nbytes = b * k * KV_BYTES_PER_TOKEN["kv584"] + 2 * q.numel() * 2 + idx.numel() * 4
        _row("sparse_mla_decode", f"b{b} h{heads} k{k}", nbytes,
             lambda q=q, idx=idx, sinks=sinks, out=out: sparse_mla.sparse_mla_decode(q, pool, idx, sinks, 512 ** -0.5,
                                                                                       out=out), "sparse",
             same_copy_ms=_copy_ms(nbytes))
        _mma_floor(RESULTS["sparse"][-1], nbytes, flops=b * heads * k * 512 * 2 * 2, peak=peak)


def sec_compress_parts() -> None:
    """compress_store for HCA windows at fewer entries than SMs, one pass against windows split into parts
    (pooled by separate programs, then merged): the choice :func:`kernels.compressor._split` makes."""
    say("\ncompress_store, HCA windows of 128 rows pooled in one pass or in parts (parts=None: the default)")
    sizes = ((2, 16),) if ARGS.smoke else ((128, 128), (256, 128), (512, 128))
    for n_ent, length in sizes:
        a, nb = _compress_inputs(n_ent, length)
        copy = _copy_ms(nb)
        for parts in (None, 1, 2, 4, 8, 16):
            if parts and (length % (parts * 4) or length // parts < 4):
                continue
            _row("compress_store", f"{n_ent}x{length} parts={parts}", nb,
                 lambda a=a, p=parts: compressor.compress_store(*a, parts=p), "membound", same_copy_ms=copy)
        del a


_CKPTS: dict = {}


def checkpoint(preset: str, mxfp4: bool):
    """One random bf16 checkpoint per (preset, MXFP4 experts), shared by the sections."""
    from engine.v4.tiny import write_tiny

    key = (preset, mxfp4)
    if key not in _CKPTS:
        _CKPTS[key] = write_tiny(tempfile.mkdtemp() + "/ckpt", preset=preset, seed=0, mxfp4=mxfp4,
                                 dtype=torch.bfloat16)
    return _CKPTS[key]


def sec_engine() -> None:
    say("\nV4 engine greedy decode, tok/s (batch x steps / time) against HF transformers in the same run")
    from engine.v4.generate import generate
    from engine.v4.loader import load_v4

    presets = ("tiny",) if ARGS.smoke else ("tiny", "small")
    steps = 2 if ARGS.smoke else 32
    for preset in presets:
        d = checkpoint(preset, mxfp4=False)
        prompts = [[5 + i] * (8 + 3 * i) for i in range(2 if ARGS.smoke else 4)]
        dtype = torch.float32 if ARGS.smoke else torch.bfloat16
        rates = {}
        for backend in (("torch",) if ARGS.smoke else ("torch", "triton")):
            m = load_v4(d, dtype=dtype, device=DEV, backend=backend)
            generate(m, prompts, 2)
            if DEV == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            generate(m, prompts, steps)
            if DEV == "cuda":
                torch.cuda.synchronize()
            rates[f"ours-{backend}"] = len(prompts) * steps / (time.perf_counter() - t)
            del m
        try:
            import transformers
            from transformers.utils import logging

            logging.set_verbosity_error()
            hf = transformers.DeepseekV4ForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager",
                                                                     local_files_only=True)
            hf = hf.to(DEV).eval()  # type: ignore[arg-type]
            ids = torch.tensor([prompts[0]] * len(prompts), device=DEV)  # HF: one length (no ragged support)
            with torch.no_grad():
                hf.generate(ids, max_new_tokens=2, do_sample=False)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                hf.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
                if DEV == "cuda":
                    torch.cuda.synchronize()
            rates["hf"] = len(prompts) * steps / (time.perf_counter() - t)
        except Exception as exc:  # the anchor's absence is reported, not fatal: our numbers still stand
            rates["hf"] = float("nan")
            RESULTS["errors"].append(f"HF anchor unavailable: {type(exc).__name__}: {exc}")
        RESULTS["engine"].append({"preset": preset, "batch": len(prompts), "steps": steps, **rates})
        line = "  ".join(f"{k} {v:8.1f}" for k, v in rates.items())
        say(f"{preset:<6} batch {len(prompts)} x {steps} steps: {line}  (ours-torch / hf = "
            f"{rates['ours-torch'] / rates['hf']:.2f}x)")


def sec_decode() -> None:
    """Greedy decode of the Triton path against the torch path, each divergence classified near-tie or break
    by the torch path's top-2 margin there (``engine.golden``)."""
    from engine.golden import GoldenRecord, compare_records
    from engine.v4.generate import generate
    from engine.v4.loader import load_v4

    preset = "tiny" if ARGS.smoke else "small"
    dtype = torch.float32 if ARGS.smoke else torch.bfloat16
    near_tie = 0.1  # logits: ~2.5 bf16 ulps at |logit| 10 (engine.golden's default)
    steps = 1 if ARGS.smoke else 32
    d = checkpoint(preset, mxfp4=True)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 250, (n,), generator=g).tolist() for n in ((4,) if ARGS.smoke else
                                                                            (5, 40, 130, 17, 300, 64, 9, 200))]
    kvs = ("dense",) if ARGS.smoke else ("dense", "fp8")
    say(f"\ngreedy decode, Triton path vs torch path ({preset}, {dtype}, MXFP4 experts kept, {len(prompts)} ragged "
        f"prompts x {steps} steps; near-tie below a {near_tie} logit margin)")
    runs = {}
    for kv in kvs:
        for backend in ("torch", "triton"):
            m = load_v4(d, dtype=dtype, device=DEV, backend=backend, mxfp4="keep")
            outs = generate(m, prompts, steps, kv=kv)
            runs[(kv, backend)] = [GoldenRecord(i, o.prompt, o.tokens, o.margins) for i, o in enumerate(outs)]
            del m
    pairs = [(("dense", "torch"), ("dense", "triton"))]
    if not ARGS.smoke:
        pairs += [(("fp8", "torch"), ("fp8", "triton")), (("dense", "torch"), ("fp8", "triton"))]
    for ref, cand in pairs:
        r = compare_records(runs[ref], runs[cand], near_tie=near_tie)
        counts = {st: sum(p.status == st for p in r.prompts) for st in ("match", "near-tie", "break")}
        RESULTS["decode"].append({"reference": "/".join(ref), "candidate": "/".join(cand), **counts,
                                  "prompts": [dataclasses.asdict(p) for p in r.prompts]})
        say(f"{'/'.join(cand):<14} vs {'/'.join(ref):<12}: {counts}")
        say(r.table())


SECTIONS = {"ceiling": sec_ceiling, "membound": sec_membound, "sparse": sec_sparse, "engine": sec_engine,
            "decode": sec_decode, "compress_parts": sec_compress_parts}


def main() -> int:
    if DEV == "cuda":
        from kernels.harness import device_info

        RESULTS["device"] = device_info("cuda")
        say(f"device: {RESULTS['device'].get('gpu')} cc {RESULTS['device'].get('compute_capability')}")
    failed = 0
    for name in ARGS.sections.split(","):
        if time.perf_counter() - T0 > ARGS.budget:
            say(f"[{name}] skipped: past the {ARGS.budget:.0f} s budget")
            continue
        try:
            SECTIONS[name]()
        except Exception:
            failed += 1
            tb = traceback.format_exc()
            RESULTS["errors"].append(f"{name}: {tb}")
            say(f"[{name}] FAILED:\n{tb}")
    os.makedirs(ARGS.out, exist_ok=True)
    with open(os.path.join(ARGS.out, "v4_bench.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    with open(os.path.join(ARGS.out, "v4_bench.txt"), "w") as f:
        f.write("\n".join(LINES) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
