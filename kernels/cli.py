"""``drift-audit kernels parity``: run kernel parity specs and print the verdict table.

Import-light: torch and triton load inside the handler, after the device (and so the interpreter) is chosen.
"""

from __future__ import annotations

import argparse
import os
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("kernels", help="Triton kernel parity against the torch references")
    sub = p.add_subparsers(dest="kernels_command", metavar="SUBCOMMAND", required=True)
    par = sub.add_parser("parity", help="run parity specs and print op, case, metric, value, tolerance, pass")
    par.add_argument("--op", action="append", metavar="NAME", help="op to run (repeatable; default: all)")
    par.add_argument("--case", metavar="TEXT", help="only cases whose name contains TEXT")
    par.add_argument("--device", choices=("cpu", "cuda"), help="cpu runs the small cases under the Triton "
                     "interpreter; cuda runs the full sweep (default: cuda when available)")
    par.add_argument("--json", metavar="FILE", help="also write the results (with CaseResult-shaped cases) here")
    par.add_argument("--list", action="store_true", help="list the registered ops and exit")
    par.set_defaults(handler=_parity)


def _parity(args: argparse.Namespace) -> int:
    if args.device:  # before any kernel module is imported: interpreter for cpu, compiled kernels for cuda
        os.environ["TRITON_INTERPRET"] = "1" if args.device == "cpu" else "0"
    from kernels import registry

    if args.list:
        print("\n".join(sorted(registry.OPS)))
        return 0
    ops = args.op or list(registry.OPS)
    unknown = [o for o in ops if o not in registry.OPS]
    if unknown:
        print(f"unknown op(s): {', '.join(unknown)}; known: {', '.join(sorted(registry.OPS))}", file=sys.stderr)
        return 2

    import torch

    from kernels.arch import interpreting
    from kernels.harness import Row, format_table, run_spec, write_json

    device = args.device or ("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is available here; use --device cpu", file=sys.stderr)
        return 2
    if device == "cuda" and interpreting():
        print("--device cuda: TRITON_INTERPRET=1 is set; unset it to run compiled kernels", file=sys.stderr)
        return 2
    rows: list[Row] = []
    for op in ops:
        try:
            spec = registry.load_spec(op)
        except Exception as exc:  # one broken module must not hide the others' results
            rows.append(Row(op=op, case="-", dtype="-", output="-", metric="-", value=None, tol=None,
                            outcome="error", message=f"could not load spec: {type(exc).__name__}: {exc}",
                            device=device))
            continue
        rows += run_spec(spec, device, case_filter=args.case)
    print(format_table(rows))
    if args.json:
        write_json(args.json, rows, device)
        print(f"wrote {args.json}")
    if not rows:
        print("no cases matched", file=sys.stderr)
        return 1
    if not any(r.passed for r in rows):
        print("every matched case was skipped", file=sys.stderr)
        return 1
    return 1 if any(r.bad for r in rows) else 0
