"""The ``drift-audit`` console script. Each package registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Packages that contribute subcommands through ``register(subparsers)`` in their cli module.
# Those modules stay import-light: heavy imports (torch, triton, git) happen inside the handlers.
_SUBCOMMAND_MODULES = ("bot.review_cli", "checks.cli", "checks.infer_cli", "runner.cli", "engine.cli", "kernels.cli", "bot.serve_cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drift-audit", description="Cross-file drift audits for LLM inference-engine pull requests."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # that package has no commands yet
            raise
        module.register(sub)
    return parser


EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at interpreter exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `drift-audit facts … | head`: the reader has all it wanted. Point stdout at /dev/null so the
        # interpreter's final flush cannot raise again, and say nothing.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
