"""Decode throughput of the bundled engine against HF transformers, plus an HF-vs-engine parity check.

    PYTHONPATH=. python3 benchmarks/engine_decode.py                  # cuda: tiny + small, batch 1 and 32
    PYTHONPATH=. python3 benchmarks/engine_decode.py --device cpu --quick

Both models get the same random weights (engine.tiny) in the same dtype. Decode tokens/s counts only
decode steps: ``batch * (N - 1) / (t(N new tokens) - t(1 new token))``, so prefill is excluded on both sides.
HF transformers in this same run is the anchor every ratio is taken against. The parity part prefills a
batch in both models (max |Δlogit|, cosine) and compares 32 greedy steps with the golden comparator
(HF as reference; a divergence is a near-tie when HF's top-2 margin there is below max(0.1, the prefill's
max |Δlogit|), i.e. within the disagreement the two implementations already show on the same input).

Imports only torch, transformers, safetensors and this repo's engine/kernels packages.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.config import parse_config  # noqa: E402
from engine.generate import generate  # noqa: E402
from engine.golden import GoldenRecord, compare_records  # noqa: E402
from engine.loader import load_tensors  # noqa: E402
from engine.tiny import PRESETS, random_weights  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hf_model(cfg_dict: dict, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
    """HF DeepseekV3ForCausalLM holding ``tensors`` (stacking experts if this transformers fuses them)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "torch_dtype")})
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = DeepseekV3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    state = {}
    for name, p in model.state_dict().items():
        if name in tensors:
            state[name] = tensors[name]
        elif name.endswith("experts.gate_up_proj"):
            pre = name.removesuffix("gate_up_proj")
            e = p.shape[0]
            state[name] = torch.stack([torch.cat([tensors[f"{pre}{i}.gate_proj.weight"],
                                                  tensors[f"{pre}{i}.up_proj.weight"]]) for i in range(e)])
        elif name.endswith("experts.down_proj"):
            pre = name.removesuffix("down_proj")
            state[name] = torch.stack([tensors[f"{pre}{i}.down_proj.weight"] for i in range(p.shape[0])])
        elif name.endswith("rotary_emb.inv_freq") or "original_inv_freq" in name:
            continue
        else:
            raise KeyError(f"no source tensor for HF parameter {name!r}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "inv_freq" not in m]
    if missing or unexpected:
        raise RuntimeError(f"HF load: missing {missing[:4]}, unexpected {unexpected[:4]}")
    # keep HF's router in fp32 as its from_pretrained does (_keep_in_fp32_modules_strict)
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            gate.float()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


@torch.inference_mode()
def hf_greedy(model, ids: torch.Tensor, n: int):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, return_dict_in_generate=True, output_scores=True)
    return out.sequences[:, ids.shape[1]:], out.scores


def time_decode(fn, n: int, device: torch.device, repeats: int) -> float | None:
    """Seconds for ``n - 1`` decode steps: t(n new tokens) - t(1 new token), best of ``repeats``; None when
    that difference drowns in timing noise (under 5 % of t(n), e.g. a loaded CPU)."""
    def best(k: int) -> float:
        ts = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            fn(k)
            sync(device)
            ts.append(time.perf_counter() - t0)
        return min(ts)

    fn(2)  # warm-up: allocator, cuBLAS handles, kernel compilation
    tn = best(n)
    dt = tn - best(1)
    return dt if dt > 0.05 * tn else None


def over_budget(args) -> bool:
    """Past the time budget, remaining timings are skipped so the run still ends with its table."""
    return time.perf_counter() - args.started > args.time_budget


def bench_config(name: str, args, device: torch.device, dtype: torch.dtype) -> tuple[list[list[str]], list[str]]:
    cfg_dict = dict(PRESETS[name], num_nextn_predict_layers=0, **args.overrides)
    t0 = time.perf_counter()
    tensors = random_weights(cfg_dict, seed=0, dtype=dtype, device=device)
    cfg = parse_config(cfg_dict, name)
    max_pos = args.prompt_len + args.steps + 8
    engines = {}
    for label, mla, backend in (("engine naive", "naive", "torch"), ("engine absorbed", "absorbed", "torch"),
                                ("engine triton", "absorbed", "triton")):
        if backend not in args.backends:
            continue
        try:
            model = load_tensors(cfg, tensors, dtype=dtype, device=device, backend=backend, max_positions=max_pos)
            if backend == "triton":  # the paged-cache decoder with CUDA graphs, where it exists
                try:
                    from engine.triton_decode import PagedDecoder
                except ImportError:
                    engines[label] = (lambda p, k, m=model: generate(m, p, k, mla="absorbed"), mla)
                else:
                    dec = PagedDecoder(model)
                    engines[label] = (lambda p, k, d=dec: d.generate(p, k), dec)
            else:
                engines[label] = (lambda p, k, m=model, a=mla: generate(m, p, k, mla=a), model)
        except Exception as exc:  # a backend missing an op is a result, not a crash
            engines[label] = (exc, mla)
    hf = None
    if not args.skip_hf:
        try:
            hf = hf_model(cfg_dict, tensors, dtype, device)
        except Exception as exc:
            hf = exc
    del tensors
    notes = [f"{name}: built in {time.perf_counter() - t0:.1f} s"]

    gen = torch.Generator().manual_seed(1)
    rows = []
    for batch in args.batches:
        ids = torch.randint(2, cfg.vocab_size, (batch, args.prompt_len), generator=gen).to(device)
        prompts = ids.tolist()
        row = [name, str(batch)]
        anchor = None
        if isinstance(hf, Exception) or hf is None:
            row.append("n/a")
        elif over_budget(args):
            row.append("skipped")
        else:
            try:
                dt = time_decode(lambda k, m=hf, x=ids: hf_greedy(m, x, k), args.steps, device, args.repeats)
                anchor = batch * (args.steps - 1) / dt if dt else None
                row.append(f"{anchor:,.1f}" if anchor else "noisy")
            except Exception as exc:
                row.append("error")
                notes.append(f"HF {name} b{batch}: {type(exc).__name__}: {exc}".splitlines()[0])
        for label, (run, _) in engines.items():
            if isinstance(run, Exception):
                row.append("n/a")
                continue
            if over_budget(args):
                row.append("skipped")
                continue
            try:
                dt = time_decode(lambda k, f=run, p=prompts: f(p, k), args.steps, device, args.repeats)
                tps = batch * (args.steps - 1) / dt if dt else None
                row.append("noisy" if tps is None else f"{tps:,.1f}" + (f" ({tps / anchor:.2f}x)" if anchor else ""))
            except Exception as exc:
                row.append("error")
                notes.append(f"{label} {name} b{batch}: {type(exc).__name__}: {exc}".splitlines()[0])
        rows.append(row)
        print("# row: " + "  ".join(row), flush=True)
    for label, (run, _) in engines.items():
        if isinstance(run, Exception):
            notes.append(f"{label} {name}: not built: {type(run).__name__}: {run}".splitlines()[0])
    if isinstance(hf, Exception):
        notes.append(f"HF {name}: not built: {type(hf).__name__}: {hf}".splitlines()[0])

    parity = []
    if not isinstance(hf, Exception) and hf is not None and not over_budget(args):
        try:
            parity = parity_rows(name, cfg, hf, engines, device, args)
        except Exception as exc:
            parity = [f"parity {name}: failed: {type(exc).__name__}: {exc}".splitlines()[0]]
    del engines, hf
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, notes + parity


@torch.inference_mode()
def parity_rows(name, cfg, hf, engines, device, args) -> list[str]:
    """Last-position prefill logits and greedy decode, HF against each engine form."""
    from engine.generate import prefill_logits

    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(2, cfg.vocab_size, (4, args.prompt_len), generator=gen).to(device)
    ref_logits = hf(ids).logits.float()
    seqs, scores = hf_greedy(hf, ids, args.parity_steps)
    top2 = torch.stack(scores, dim=1).float().topk(2, dim=-1).values  # [B, N, 2]
    margins = (top2[..., 0] - top2[..., 1]).tolist()
    ref = [GoldenRecord(i, ids[i].tolist(), seqs[i].tolist(), margins[i]) for i in range(ids.shape[0])]
    out = []
    for label, (run, model) in engines.items():
        if isinstance(run, Exception):
            continue
        if label in ("engine naive", "engine absorbed"):
            logits, ref_l, where = prefill_logits(model, ids, label.split()[1]), ref_logits, ""
        else:  # the paged decoder returns logits at each prompt's last token
            model.setup(ids.shape[0], ids.shape[1] + args.parity_steps + 1)
            lens = torch.full((ids.shape[0],), ids.shape[1], device=device)
            logits, ref_l, where = model.prefill(ids, lens), ref_logits[:, -1], "last-token "
        diff = (logits - ref_l).abs().max().item()
        cos = torch.nn.functional.cosine_similarity(logits.flatten(), ref_l.flatten(), dim=0).item()
        logit_note = f"{where}max|dlogit| {diff:.3g} of max|logit| {ref_l.abs().max().item():.3g}, cosine {cos:.6f}"
        cand = [GoldenRecord(i, g.prompt, g.tokens, g.margins) for i, g in enumerate(run(ids.tolist(), args.parity_steps))]
        # a step whose HF margin is below the logit disagreement measured on the prefill can flip either way
        threshold = max(0.1, diff)
        cmp = compare_records(ref, cand, near_tie=threshold)
        per = ", ".join(f"{p.match_length}/{p.compared}" + ("" if p.status == "match" else
                        f" {p.status}@{p.first_divergence} (margin {p.reference_margin:.3g})") for p in cmp.prompts)
        out.append(f"parity {name} {label} vs HF ({args.dtype}, {device.type}): {logit_note}; greedy match over "
                   f"{args.parity_steps} steps {per} (near-tie < {threshold:.3g}) -> {'OK' if cmp.ok else 'BREAK'}")
    return out


# --- the roofline: tokens/s against the bytes a decode step must read -----------------------------------

def copy_ceiling(device: torch.device) -> float:
    """Device-to-device copy, bytes read + written per second (the same ceiling the kernel benchmarks use)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 22)
    src = torch.randn(n // 4, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    return 2 * n * 10 / (time.perf_counter() - t0)


def static_bytes(model, batch: int) -> int:
    """Weights every decode step reads whatever the routing: all parameters except the routed experts and the
    embedding table (of which only ``batch`` rows are read), at their stored width."""
    total = 0
    for name, p in model.named_parameters():
        if ".mlp.experts." in name:
            continue
        if name.endswith("embed_tokens.weight"):
            total += batch * p.shape[1] * p.element_size()
            continue
        total += p.numel() * p.element_size()
    return total


def expert_bytes(model) -> int:
    """One routed expert's three matrices (gate, up, down), at their stored width."""
    for layer in model.decoder_layers:
        ex = getattr(layer.mlp, "experts", None)
        if ex is not None:
            return sum(w[0].numel() * w.element_size() for w in (ex.gate_proj, ex.up_proj, ex.down_proj))
    return 0


class RoutingTap:
    """Counts the distinct routed experts of each MoE layer over the forwards run while it is attached."""

    def __init__(self, model):
        self.counts: list[int] = []
        self._hooks = [layer.mlp.gate.register_forward_hook(self._hook) for layer in model.decoder_layers
                       if hasattr(layer.mlp, "gate")]

    def _hook(self, module, args, out):
        self.counts.append(int(torch.unique(out[1]).numel()))

    def close(self) -> None:
        for h in self._hooks:
            h.remove()


def _graph_rate(step, batch: int, steps: int, device: torch.device) -> float:
    """tokens/s of ``steps`` calls of ``step(i)`` (decode steps), timed after two warm-up calls."""
    for i in range(2):
        step(i)
    sync(device)
    t0 = time.perf_counter()
    for i in range(2, steps + 2):
        step(i)
    sync(device)
    return batch * steps / (time.perf_counter() - t0)


@torch.inference_mode()
def roofline(args, device: torch.device, dtype: torch.dtype) -> list[str]:
    """Decode tokens/s of each engine form at each batch, as a share of the HBM bound: the bytes one step must
    read (every non-expert weight, the experts the batch actually routes to, the latent KV of every layer)
    over the copy ceiling measured in this run. Anchors in the same run: HF transformers and the torch
    backend under torch.compile (reduce-overhead, max-autotune)."""
    from engine.loader import load_tensors
    from engine.triton_decode import PagedDecoder

    name = args.roofline_config
    cfg_dict = dict(PRESETS[name], num_nextn_predict_layers=0, **args.overrides)
    tensors = random_weights(cfg_dict, seed=0, dtype=dtype, device=device)
    cfg = parse_config(cfg_dict, name)
    ceiling = copy_ceiling(device)
    max_len = args.prompt_len + args.steps + 8
    forms: dict[str, object] = {}
    for backend in ("triton",) if args.no_torch else ("triton", "torch"):
        try:
            forms[backend] = load_tensors(cfg, tensors, dtype=dtype, device=device, backend=backend,
                                          max_positions=max_len)
        except Exception as exc:  # a backend that cannot be built is a result
            forms[backend] = exc
    hf = None
    if not args.skip_hf:
        try:
            hf = hf_model(cfg_dict, tensors, dtype, device)
        except Exception as exc:
            hf = exc
    del tensors
    ref = forms["torch"] if not isinstance(forms.get("torch", RuntimeError()), Exception) else forms["triton"]
    per_expert = expert_bytes(ref)
    kv_row = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * torch.tensor([], dtype=dtype).element_size()
    lines = [f"roofline {name} ({args.dtype}, {device.type}): copy ceiling {ceiling / 1e12:.2f} TB/s; "
             f"one routed expert {per_expert / 1e6:.1f} MB; non-expert weights {static_bytes(ref, 1) / 1e6:.0f} MB"]
    header = ["batch", "experts/layer", "MB/step", "bound tok/s", "ours (triton, graph)", "torch eager",
              "compile reduce-overhead", "compile max-autotune", "HF transformers"]
    rows = []
    gen = torch.Generator().manual_seed(3)
    compiled: dict[str, object] = {}
    for batch in args.roofline_batches:
        ids = torch.randint(2, cfg.vocab_size, (batch, args.prompt_len), generator=gen).to(device)
        lens = torch.full((batch,), args.prompt_len, device=device)
        cells: dict[str, str] = {}
        bound = None
        # ours: the paged decoder (Triton ops, CUDA graph where it can); its eager steps also count the routing
        model = forms["triton"]
        if isinstance(model, Exception):
            cells["ours"] = "n/a"
        else:
            try:
                dec = PagedDecoder(model)
                dec.setup(batch, max_len)
                logits = dec.prefill(ids, lens)
                tap = RoutingTap(model)
                nxt = logits.argmax(-1)
                for i in range(3):  # eager steps at the positions the timed steps overwrite
                    nxt = dec._decode_eager(nxt, lens + i).argmax(-1)
                tap.close()
                n_moe = max(1, sum(hasattr(layer.mlp, "gate") for layer in model.decoder_layers))
                experts = sum(tap.counts) / max(1, len(tap.counts))
                mid = args.prompt_len + args.steps // 2  # mean context over the timed steps
                nbytes = (static_bytes(model, batch) + n_moe * experts * per_expert
                          + cfg.num_hidden_layers * batch * mid * kv_row)
                bound = batch / (nbytes / ceiling)
                cells["experts"] = f"{experts:.1f}"
                cells["mb"] = f"{nbytes / 1e6:,.0f}"
                cells["bound"] = f"{bound:,.0f}"
                rate = _graph_rate(lambda i, d=dec, n=nxt, ln=lens: d.step(n, ln + i), batch, args.steps, device)
                cells["ours"] = f"{rate:,.0f} ({100 * rate / bound:.0f}%)" + ("" if dec.graphed else " eager")
                if args.profile and device.type == "cuda" and (not args.profile_batches or batch in args.profile_batches):
                    try:
                        prof = profile_step(dec, nxt, lens, batch, 1e6 * batch / rate, nbytes, ceiling,
                                            args.profile_top)
                        lines += prof
                        print("\n".join(prof), flush=True)  # kept even if a later cell runs past a hard limit
                    except Exception as exc:  # the profile is a diagnosis, never the result
                        lines.append(f"profile b{batch}: {type(exc).__name__}: {exc}".splitlines()[0])
                dec = None
            except Exception as exc:
                cells["ours"] = "error"
                lines.append(f"roofline ours b{batch}: {type(exc).__name__}: {exc}".splitlines()[0])
        def pct(r: float, bound=bound) -> str:
            return f"{r:,.0f}" + (f" ({100 * r / bound:.0f}%)" if bound else "")

        model = forms.get("torch", RuntimeError("torch backend not built (--no-torch)"))
        for label, mode in (("eager", None), ("reduce-overhead", "reduce-overhead"), ("max-autotune", "max-autotune")):
            if isinstance(model, Exception) or over_budget(args) or (mode and args.no_compile) or (
                    mode and (mode not in args.compile_modes or batch not in args.compile_batches)):
                cells[label] = "n/a" if isinstance(model, Exception) else "skipped"
                continue
            try:
                model.setup_cache(batch, max_len, "absorbed", static=mode is not None)
                pos = torch.arange(args.prompt_len, device=device).unsqueeze(0).expand(batch, -1)
                nxt = model(ids, pos).argmax(-1, keepdim=True)
                fn = model if mode is None else compiled.get(mode)
                if fn is None:
                    fn = compiled[mode] = compile_step(model, mode)
                t0 = time.perf_counter()
                fn(nxt, (lens + 0).unsqueeze(1))  # compiles on first use of this batch size
                sync(device)
                took = time.perf_counter() - t0
                rate = _graph_rate(lambda i, f=fn, n=nxt, ln=lens: f(n, (ln + 1 + i).unsqueeze(1)), batch, args.steps,
                                   device)
                cells[label] = pct(rate) + (f" [first call {took:.0f}s]" if mode else "")
            except Exception as exc:
                cells[label] = "error"
                lines.append(f"roofline torch {label} b{batch}: {type(exc).__name__}: {exc}".splitlines()[0])
        if isinstance(hf, Exception) or hf is None:
            cells["hf"] = "n/a"
        elif over_budget(args) or (args.hf_batches and batch not in args.hf_batches):
            cells["hf"] = "skipped"
        else:
            try:
                dt = time_decode(lambda k, m=hf, x=ids: hf_greedy(m, x, k), args.steps, device, args.repeats)
                cells["hf"] = pct(batch * (args.steps - 1) / dt) if dt else "noisy"
            except Exception as exc:
                cells["hf"] = "error"
                lines.append(f"roofline HF b{batch}: {type(exc).__name__}: {exc}".splitlines()[0])
        rows.append([str(batch)] + [cells.get(k, "-") for k in ("experts", "mb", "bound", "ours", "eager",
                                                               "reduce-overhead", "max-autotune", "hf")])
        print("# roofline row: " + "  ".join(rows[-1]), flush=True)
    if isinstance(hf, Exception):
        lines.append(f"roofline HF: not built: {type(hf).__name__}: {hf}".splitlines()[0])
    if args.greedy_steps and over_budget(args):
        lines.append("greedy check: skipped (time budget)")
    elif args.greedy_steps and not any(isinstance(forms.get(b, RuntimeError()), Exception) for b in ("triton", "torch")):
        try:
            lines.append(greedy_check(forms["triton"], forms["torch"], cfg, args, device, PagedDecoder))
        except Exception as exc:
            lines.append(f"greedy check: {type(exc).__name__}: {exc}".splitlines()[0])
    lines.append(table(rows, header))
    lines.append("(%) = tokens/s over the bound: batch / (MB/step over the copy ceiling). The torch backend's "
                 "expert loop (data-dependent shapes) runs eagerly inside the compiled step.")
    return lines


def greedy_check(triton_model, torch_model, cfg, args, device, PagedDecoder) -> str:
    """Greedy tokens of the Triton paged decoder (CUDA graph) against the torch backend (absorbed, dense cache),
    4 prompts; a divergence is a near-tie when the torch backend's top-2 margin there is below 0.1."""
    gen = torch.Generator().manual_seed(5)
    prompts = torch.randint(2, cfg.vocab_size, (4, args.prompt_len), generator=gen).tolist()
    n = args.greedy_steps
    ref = generate(torch_model, prompts, n, mla="absorbed")
    dec = PagedDecoder(triton_model)
    out = dec.generate(prompts, n)
    recs = [[GoldenRecord(i, g.prompt, g.tokens, g.margins) for i, g in enumerate(gs)] for gs in (ref, out)]
    cmp = compare_records(*recs, near_tie=0.1)
    per = ", ".join(f"{p.match_length}/{p.compared}" + ("" if p.status == "match" else
                    f" {p.status}@{p.first_divergence} (torch margin {p.reference_margin:.3g})") for p in cmp.prompts)
    return (f"greedy {args.dtype}: triton paged decoder ({'graph' if dec.graphed else 'eager'}) vs torch backend, "
            f"{n} steps: {per} -> {'OK' if cmp.ok else 'BREAK'}")


def profile_step(dec, nxt, lens, batch: int, step_us: float, nbytes: float, ceiling: float, top: int = 10) -> list[str]:
    """Where one decode step's time goes: torch.profiler over eager steps (the graph replays the same kernels
    without the launch gaps), kernels grouped by name, the top ones with their share of the GPU-busy time."""
    from torch.profiler import ProfilerActivity, profile

    reps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            dec._decode_eager(nxt, lens + 10 + i)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    busy = sum(e.self_device_time_total for e in events) / reps
    events.sort(key=lambda e: -e.self_device_time_total)
    out = [f"profile b{batch}: graph step {step_us:.1f} us; GPU busy {busy:.1f} us in "
           f"{sum(e.count for e in events) // reps} kernels per step; bound {1e6 * nbytes / ceiling:.1f} us"]
    for e in events[:top]:
        per = e.self_device_time_total / reps
        out.append(f"  {per:8.1f} us {100 * per / busy:5.1f}%  x{e.count // reps:<3d} {e.key[:90]}")
    return out


# (name, N, K, weight dtype): the small config's decode projections (q|kv_a, o, shared gate|up and down, the
# dense layer's gate|up and down, the fp32 router)
LINEAR_SHAPES = [("q|kv_a", 3648, 2048, torch.bfloat16), ("o_proj", 2048, 2048, torch.bfloat16),
                 ("shared gate|up", 5632, 2048, torch.bfloat16), ("shared down", 2048, 2816, torch.bfloat16),
                 ("dense gate|up", 21888, 2048, torch.bfloat16), ("dense down", 2048, 10944, torch.bfloat16),
                 ("router fp32", 64, 2048, torch.float32)]
LINEAR_CONFIGS = [(16, 512, 4, 3), (32, 256, 4, 4), (16, 128, 4, 6), (64, 128, 4, 4), (32, 512, 8, 3), (4, 512, 4, 1),
                  (8, 256, 4, 1)]  # BLOCK_N < 16: the kernel without tensor cores


def _graph_us(calls, device: torch.device, reps: int = 5) -> float:
    """µs per call of ``calls`` (a list of thunks over rotated weight copies), replayed as one CUDA graph."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for c in calls:
            c()
        return 1e6 * (time.perf_counter() - t0) / len(calls)
    for c in calls:
        c()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    sync(device)
    best = float("inf")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        sync(device)
        best = min(best, 1000 * a.elapsed_time(b) / len(calls))
    return best


def _time_linear(label: str, fn, ws: list, ref: torch.Tensor, nbytes: int, device: torch.device) -> str:
    from kernels.metrics import gemm_diff

    try:
        err = gemm_diff(fn(ws[0]).float(), ref).value
        us = _graph_us([lambda w=w: fn(w) for w in ws], device)
        return f"{label} {us:.1f} ({nbytes / us / 1e6:.2f})" + ("" if err < 1e-4 else f" ERR {err:.1e}")
    except Exception as exc:
        return f"{label} error {type(exc).__name__}: {str(exc)[:60]}"


@torch.inference_mode()
def linear_section(args, device: torch.device) -> list[str]:
    """The decode projections: kernels.gemv.linear (each tile config) against F.linear (cuBLAS), at M rows,
    each call on another copy of the weight (≥ 256 MB in rotation, so L2 holds none of them)."""
    import torch.nn.functional as F

    from kernels.gemv import gemv_config, linear

    ceiling = copy_ceiling(device)
    scale = 1 if device.type == "cuda" else 16
    lines = [f"linear (decode projections): copy ceiling {ceiling / 1e12:.2f} TB/s; µs per call (TB/s of weight)"]
    ms = [1, 8, 16] if not args.quick else [1]
    configs = LINEAR_CONFIGS if device.type == "cuda" and not args.quick else []
    weights = {}
    for name, n, k, wdt in LINEAR_SHAPES:
        n, k = max(16, n // scale), max(16, k // scale)
        nbytes = n * k * torch.tensor([], dtype=wdt).element_size()
        copies = max(2, min(64, (256 << 20) // nbytes)) if device.type == "cuda" else 2
        weights[name] = [torch.randn(n, k, device=device).div_(k ** 0.5).to(wdt) for _ in range(copies)]
    for m in ms:  # every shape at M=1 first: the budget cuts the larger batches
        for name, _, _, wdt in LINEAR_SHAPES:
            ws = weights[name]
            n, k = ws[0].shape
            nbytes = ws[0].numel() * ws[0].element_size()
            if over_budget(args):
                lines.append(f"  {name} M={m}: skipped (time budget)")
                continue
            out_dt = torch.float32 if wdt == torch.float32 else None
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            ref = F.linear(x.float(), ws[0].float())
            cells = [_time_linear("cuBLAS", lambda w, x=x: F.linear(x.to(w.dtype), w), ws, ref, nbytes, device),
                     _time_linear(f"default{gemv_config(m, n, k, ws[0].element_size(), (9, 0))}",
                                  lambda w, x=x, o=out_dt: linear(x, w, o), ws, ref, nbytes, device)]
            cells += [_time_linear(str(cfg), lambda w, x=x, o=out_dt, cfg=cfg: linear(x, w, o, config=cfg), ws, ref,
                                   nbytes, device) for cfg in configs if m == 1 or cfg[0] >= 16]
            lines.append(f"  {name} {n}x{k} M={m}: " + "; ".join(cells))
            print(lines[-1], flush=True)
    return lines


MOE_CONFIGS = [(16, 32, 128, 4, 4), (16, 64, 256, 4, 3), (16, 128, 128, 8, 4), (32, 64, 128, 4, 4)]


@torch.inference_mode()
def moe_section(args, device: torch.device, dtype: torch.dtype) -> list[str]:
    """The routed experts of one small-config layer at decode batches: the default tiles against a few others,
    each call routed afresh (8 routings in rotation), replayed as a CUDA graph; TB/s of distinct expert bytes."""
    from kernels.arch import capability
    from kernels.moe import MoeConfig, moe_config, moe_experts, route_random

    cfg = PRESETS["small"] if not args.quick else PRESETS["tiny"]
    d, i, e, k = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    gen = torch.Generator(device=device).manual_seed(4)
    ws = [(torch.randn(e, i, d, generator=gen, device=device) / d ** 0.5).to(dtype) for _ in range(2)]
    w2 = (torch.randn(e, d, i, generator=gen, device=device) / i ** 0.5).to(dtype)
    lines = [f"moe experts (d {d}, i {i}, {e} experts, top-{k}): µs per call (TB/s of the experts touched)"]
    per_expert = 3 * d * i * w2.element_size()
    for t in ([1, 128] if not args.quick else [2]):
        if over_budget(args):
            lines.append(f"  t={t}: skipped (time budget)")
            continue
        x = torch.randn(t, d, generator=gen, device=device).to(dtype)
        routes = [route_random(t, e, k, device, gen) for _ in range(8)]
        touched = sum(int(torch.unique(r[1]).numel()) for r in routes) / len(routes)
        default = moe_config(t, k, e, capability(device), w2.element_size())
        cells = []
        for c in [None] + ([MoeConfig(*v) for v in MOE_CONFIGS] if device.type == "cuda" and not args.quick else []):
            try:
                calls = [lambda r=r, c=c, x=x: moe_experts(x, r[0], r[1], ws[0], ws[1], w2, config=c) for r in routes]
                us = _graph_us(calls, device)
                label = "default " + str(tuple(default.__dict__.values())) if c is None else str(tuple(c.__dict__.values()))
                cells.append(f"{label} {us:.1f} ({touched * per_expert / us / 1e6:.2f})")
            except Exception as exc:
                cells.append(f"{c} error {type(exc).__name__}: {str(exc)[:60]}")
        lines.append(f"  t={t} ({touched:.1f} experts): " + "; ".join(cells))
        print(lines[-1], flush=True)
    return lines


def compile_step(model, mode: str):
    """The torch backend's decode step under ``torch.compile(mode=...)`` over a static cache; the reference
    expert loop stays eager (its per-expert token counts are data-dependent shapes)."""
    ops = model.ops
    ops._cache["moe_experts"] = torch.compiler.disable(ops.moe_experts)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(model, mode=mode, dynamic=True)  # one compile serves every batch size


def table(rows: list[list[str]], header: list[str]) -> str:
    allrows = [header] + rows
    w = [max(len(r[i]) for r in allrows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r)) for r in allrows]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--configs", default=None, help="comma list of presets (default: tiny,small; --quick: tiny)")
    p.add_argument("--batches", default=None, help="comma list (default 1,32; --quick: 1,4)")
    p.add_argument("--steps", type=int, default=None, help="new tokens per timed run (default 32; --quick 12)")
    p.add_argument("--parity-steps", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None, help="best of N timings (default 3; --quick 1)")
    p.add_argument("--backends", default="torch,triton", help="engine backends to time: torch and/or triton")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--time-budget", type=float, default=200.0,
                   help="seconds after which remaining timings are skipped (the run must end in < 4 min on the H200)")
    p.add_argument("--set", default="{}", help='config overrides for every preset, as JSON, e.g. \'{"num_hidden_layers": 2}\'')
    p.add_argument("--quick", action="store_true", help="tiny config, small batches, few steps (CPU smoke run)")
    p.add_argument("--smoke", action="store_true", help="--quick on CPU, float32, every section once (CI)")
    p.add_argument("--sections", default="table,roofline",
                   help="comma list: table (vs HF), roofline, linear (decode projections: Triton vs cuBLAS), "
                        "moe (expert tiles at decode batches)")
    p.add_argument("--roofline-config", default=None, help="preset (default small; --quick: tiny)")
    p.add_argument("--roofline-batches", default=None, help="comma list (default 1,8,32,128; --quick: 2)")
    p.add_argument("--no-compile", action="store_true", help="roofline: skip the torch.compile anchors")
    p.add_argument("--profile", action="store_true", help="roofline: torch.profiler breakdown of our decode step")
    p.add_argument("--profile-top", type=int, default=10, help="roofline: kernels listed per profile")
    p.add_argument("--profile-batches", default=None, help="roofline: batches to profile (default all)")
    p.add_argument("--greedy-steps", type=int, default=0,
                   help="roofline: greedy tokens, Triton paged decoder vs the torch backend, 4 prompts (0: skip)")
    p.add_argument("--hf-batches", default=None, help="roofline: batches with the HF anchor (default all)")
    p.add_argument("--no-torch", action="store_true", help="roofline: skip the torch-backend anchors (eager, compile)")
    p.add_argument("--compile-modes", default="reduce-overhead,max-autotune", help="roofline: torch.compile modes")
    p.add_argument("--compile-batches", default=None, help="roofline: batches with compile anchors (default all)")
    args = p.parse_args(argv)
    if args.smoke:
        args.quick, args.device, args.dtype = True, "cpu", "float32"
        args.batches = args.batches or "2"
        args.steps, args.parity_steps, args.roofline_config, args.roofline_batches = 3, 3, "tiny", "2"
        if "triton" in args.backends:  # the table times the torch forms; the roofline runs the Triton decoder
            args.backends = "torch"
        args.no_compile = True  # inductor's CPU build takes minutes; the GPU run has the compile anchors
        args.greedy_steps = args.greedy_steps or 2
    args.sections = args.sections.split(",")
    if args.smoke:
        args.sections += [x for x in ("linear", "moe") if x not in args.sections]
    args.roofline_config = args.roofline_config or ("tiny" if args.quick else "small")
    args.roofline_batches = [int(b) for b in (args.roofline_batches or ("2" if args.quick else "1,8,32,128")).split(",")]
    args.compile_modes = args.compile_modes.split(",")
    args.profile_batches = [int(b) for b in args.profile_batches.split(",")] if args.profile_batches else []
    args.hf_batches = [int(b) for b in args.hf_batches.split(",")] if args.hf_batches else []
    args.compile_batches = ([int(b) for b in args.compile_batches.split(",")] if args.compile_batches
                            else args.roofline_batches)
    args.configs = (args.configs or ("tiny" if args.quick else "tiny,small")).split(",")
    args.batches = [int(b) for b in (args.batches or ("1,4" if args.quick else "1,32")).split(",")]
    args.steps = args.steps or (12 if args.quick else 32)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.quick:
        args.parity_steps = min(args.parity_steps, 8)
    args.backends = args.backends.split(",")
    import json

    args.overrides = json.loads(args.set)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    bad = [c for c in args.configs if c not in PRESETS]
    if bad:
        p.error(f"unknown config(s) {bad}; choose from {list(PRESETS)}")

    env = [f"torch {torch.__version__}"]
    try:
        import transformers
        env.append(f"transformers {transformers.__version__}")
    except ImportError:
        args.skip_hf = True
        env.append("transformers missing: HF columns skipped")
    if device.type == "cuda":
        env.append(torch.cuda.get_device_name(device))
        env.append("sm{}{}".format(*torch.cuda.get_device_capability(device)))
    if args.overrides:
        env.append(f"config overrides {args.overrides}")
    print(f"# engine decode benchmark: {', '.join(env)}; {args.dtype}; prompt {args.prompt_len} tokens, "
          f"{args.steps} new tokens timed (decode only), best of {args.repeats}", flush=True)
    t0 = args.started = time.perf_counter()
    rows, notes = [], []
    failed = []
    for name in args.configs if "table" in args.sections else []:
        try:
            r, n = bench_config(name, args, device, dtype)
        except Exception as exc:
            traceback.print_exc()
            print(f"section error: table {name}: {type(exc).__name__}: {exc}", flush=True)
            failed.append(f"table {name}")
            continue
        rows += r
        notes += n
        print(f"# {name} done at {time.perf_counter() - t0:.0f} s", flush=True)
    header = ["config", "batch", "HF tok/s (anchor)"]
    header += [h for h, b in (("engine naive", "torch"), ("engine absorbed", "torch"), ("engine triton", "triton"))
               if b in args.backends]
    for line in notes:
        print(line)
    print()
    if "table" in args.sections:
        print(table(rows, header) if rows else "no results")
    if "linear" in args.sections:
        try:
            for line in linear_section(args, device):
                print(line)
        except Exception as exc:
            traceback.print_exc()
            print(f"section error: linear: {type(exc).__name__}: {exc}", flush=True)
            failed.append("linear")
    if "moe" in args.sections:
        try:
            for line in moe_section(args, device, dtype):
                print(line)
        except Exception as exc:
            traceback.print_exc()
            print(f"section error: moe: {type(exc).__name__}: {exc}", flush=True)
            failed.append("moe")
    if "roofline" in args.sections:
        try:
            for line in roofline(args, device, dtype):
                print(line)
        except Exception as exc:
            traceback.print_exc()
            print(f"section error: roofline: {type(exc).__name__}: {exc}", flush=True)
            failed.append("roofline")
    if args.smoke:  # every cell must have produced a number or a reason, not an error
        bad = [ln for ln in notes if " failed: " in ln or ": not built: " in ln]
        for ln in bad:
            print(f"section error: {ln}")
        failed += bad
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 1 if failed or ("table" in args.sections and not rows) else 0


if __name__ == "__main__":
    sys.exit(main())
