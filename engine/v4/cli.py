"""``drift-audit engine tiny --arch deepseek_v4``: the V4 side of the engine CLI."""

from __future__ import annotations


def cmd_tiny_v4(args) -> int:
    from engine.v4.tiny import PRESETS, write_tiny

    if args.preset not in PRESETS:
        raise ValueError(f"--preset {args.preset!r} has no deepseek_v4 version; choose one of {', '.join(PRESETS)}")
    from engine.cli import parse_overrides

    overrides = parse_overrides(args.set, PRESETS[args.preset], "deepseek_v4")
    print(write_tiny(args.out, preset=args.preset, seed=args.seed, fp8=args.fp8, mxfp4=args.mxfp4, **overrides))
    return 0
