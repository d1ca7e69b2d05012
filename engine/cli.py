"""``drift-audit engine generate|golden|compare|tiny``. Import-light: torch loads inside the handlers."""

from __future__ import annotations

import argparse
import json
import sys

from engine.golden import DEFAULT_NEAR_TIE


def _prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids wants integer token ids, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty")
    return ids


class _PromptAction(argparse.Action):
    """``--prompt-ids 5 6 7`` or ``--prompt-ids 5,6,7``: one prompt per use of the flag."""

    def __call__(self, parser, namespace, values, option_string=None):
        prompts = list(getattr(namespace, self.dest) or [])
        prompts.append([t for part in values for t in part])
        setattr(namespace, self.dest, prompts)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--prompt-ids", type=_prompt_ids, nargs="+", action=_PromptAction, default=[], metavar="ID",
                   help="one prompt's token ids (space- or comma-separated); repeat the flag for a batch")
    p.add_argument("--prompts", help="JSON-lines file of prompts: a list of ids per line, or objects with 'prompt'")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--mla", choices=("naive", "absorbed"), default="naive", help="DeepSeek-V3 attention form")
    p.add_argument("--kv", choices=("dense", "fp8"), default="dense",
                   help="DeepSeek-V4 decode cache: dense, or the paged 584-byte FP8 pool")
    p.add_argument("--dtype", default="bfloat16", help="float32 | bfloat16 | float16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=("torch", "triton"), default="torch")
    p.add_argument("--fp8", choices=("dequant", "keep"), default="dequant",
                   help="fp8 checkpoints: dequantise on load, or keep fp8 weights for the w8a8 path")


def _read_prompts(args) -> list[list[int]]:
    prompts = list(args.prompt_ids)
    if args.prompts:
        from pathlib import Path

        try:
            text = Path(args.prompts).read_text()
        except OSError as exc:
            raise ValueError(f"{args.prompts}: cannot read prompts file: {exc.strerror}") from None
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{args.prompts}:{lineno}: invalid JSON: {exc.msg}") from None
            if isinstance(obj, dict):
                if obj.get("format") == "drift-audit-golden":
                    continue
                obj = obj.get("prompt")
            if not isinstance(obj, list) or not all(isinstance(t, int) for t in obj):
                raise ValueError(f"{args.prompts}:{lineno}: expected a list of token ids or {{'prompt': [...]}}")
            prompts.append(obj)
    if not prompts:
        raise ValueError("give at least one prompt with --prompt-ids or --prompts")
    return prompts


def _load(args):
    from engine.loader import load_model
    from engine.model import dtype_of

    def progress(done: int, total: int, name: str) -> None:
        tty = sys.stderr.isatty()
        if tty or done == total or done % max(1, total // 10) == 0:
            end = "\r" if tty and done < total else "\n"
            print(f"loading {done}/{total} tensors ({100 * done // total}%)", end=end, file=sys.stderr, flush=True)

    return load_model(args.model, dtype=dtype_of(args.dtype), device=args.device, backend=args.backend,
                      fp8=args.fp8, progress=progress)


def _model_type(model_dir: str) -> str:
    from pathlib import Path

    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return ""  # the V3 loader reports a missing or broken config.json with its path
    return str(cfg.get("model_type", "")) if isinstance(cfg, dict) else ""


def _generate(args):
    """One entry for both families: ``config.json``'s ``model_type`` picks the V3 or the V4 engine."""
    prompts = _read_prompts(args)
    if _model_type(args.model) == "deepseek_v4":
        from engine.model import dtype_of
        from engine.v4.generate import generate as generate_v4
        from engine.v4.loader import load_v4

        model = load_v4(args.model, dtype=dtype_of(args.dtype), device=args.device, backend=args.backend,
                        fp8=args.fp8)
        return model, prompts, generate_v4(model, prompts, args.max_new_tokens, kv=args.kv)
    from engine.generate import generate

    model = _load(args)
    return model, prompts, generate(model, prompts, args.max_new_tokens, mla=args.mla)


def cmd_generate(args) -> int:
    _, _, outs = _generate(args)
    for g in outs:
        print(json.dumps({"prompt": g.prompt, "tokens": g.tokens}))
    return 0


def cmd_golden(args) -> int:
    from engine.golden import GoldenRecord, write_golden

    _, prompts, outs = _generate(args)
    records = [GoldenRecord(i, g.prompt, g.tokens, g.margins) for i, g in enumerate(outs)]
    write_golden(args.out, records, model=str(args.model), mla=args.mla, dtype=args.dtype, device=args.device,
                 backend=args.backend, fp8=args.fp8, max_new_tokens=args.max_new_tokens)
    print(f"wrote {len(records)} prompt(s) to {args.out}", file=sys.stderr)
    return 0


def cmd_compare(args) -> int:
    from engine.golden import GoldenError, compare_files

    try:
        result = compare_files(args.reference, args.candidate, args.near_tie)
    except GoldenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.table())
    return 0 if result.ok else 1


def parse_overrides(text: str | None, preset: dict, arch: str) -> dict:
    """``--set`` JSON: a typo'd field would be written into config.json and silently change nothing."""
    import difflib

    try:
        overrides = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"--set is not valid JSON: {exc.msg}") from None
    if not isinstance(overrides, dict):
        raise ValueError("--set must be a JSON object of config fields")
    for key in overrides:
        if key not in preset:
            near = difflib.get_close_matches(key, list(preset), n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"fields: {', '.join(sorted(preset))}"
            raise ValueError(f"--set: '{key}' is not a {arch} config field this engine reads; {hint}")
    return overrides


def cmd_tiny(args) -> int:
    from engine.tiny import PRESETS, write_tiny

    if args.arch == "deepseek_v4":
        from engine.v4.cli import cmd_tiny_v4

        return cmd_tiny_v4(args)
    if args.mxfp4:
        raise ValueError("--mxfp4 needs --arch deepseek_v4 (DeepSeek-V3 checkpoints have no MXFP4 experts)")
    overrides = parse_overrides(args.set, PRESETS[args.preset], "deepseek_v3")
    out = write_tiny(args.out, preset=args.preset, seed=args.seed, fp8=args.fp8, **overrides)
    print(out)
    return 0


def _guard(fn):
    def run(args) -> int:
        from engine.config import ConfigError
        from engine.loader import CheckpointError
        from engine.ops import OpUnavailable

        try:
            return fn(args)
        except (ConfigError, CheckpointError, OpUnavailable, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return run


def register(subparsers) -> None:
    eng = subparsers.add_parser("engine", help="the bundled DeepSeek-V3 reference engine")
    sub = eng.add_subparsers(dest="engine_command", metavar="ACTION", required=True)

    p = sub.add_parser("generate", help="greedy-decode prompts and print the token ids")
    _model_args(p)
    p.set_defaults(handler=_guard(cmd_generate))

    p = sub.add_parser("golden", help="write a golden decode file (JSON lines with per-step margins)")
    _model_args(p)
    p.add_argument("--out", required=True, help="golden file to write")
    p.set_defaults(handler=_guard(cmd_golden))

    p = sub.add_parser("compare", help="compare a candidate decode with a golden, near-tie aware")
    p.add_argument("reference", help="golden file (the oracle)")
    p.add_argument("candidate", help="decode to check, same format")
    p.add_argument("--near-tie", type=float, default=DEFAULT_NEAR_TIE,
                   help="a divergence where the reference's top-2 margin is below this many logits is a near-tie")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(handler=cmd_compare)

    p = sub.add_parser("tiny", help="write a random DeepSeek-V3 (or --arch deepseek_v4) checkpoint in HF layout")
    p.add_argument("out", help="output directory")
    p.add_argument("--preset", choices=("tiny", "small"), default="tiny",
                   help="tiny: about 1-2 MB, for CPU tests; small: a GPU benchmark size, about 17 GB for "
                        "deepseek_v3 (hidden 2048, 64 experts, 8 layers) and 1.2 GB for deepseek_v4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp8", action="store_true", help="store projections as e4m3 with 128x128 weight_scale_inv")
    p.add_argument("--arch", choices=("deepseek_v3", "deepseek_v4"), default="deepseek_v3")
    p.add_argument("--mxfp4", action="store_true", help="deepseek_v4: routed experts as MXFP4 (e2m1 + UE8M0 per 32)")
    p.add_argument("--set", help='config overrides as JSON, e.g. \'{"num_hidden_layers": 3}\'')
    p.set_defaults(handler=_guard(cmd_tiny))
