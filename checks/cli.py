"""``drift-audit facts``: print the rows a fact yields, so a config can be written by trial."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "facts",
        help="print the rows the config's facts yield",
        description="Print the rows (key, values, file:line) each [[fact]] yields on a revision. "
        "The config is the work tree's .github/drift-audit.toml when it exists (so edits show at once), "
        "else the one committed at REV; --config names another file.",
    )
    p.add_argument("path", nargs="?", default=".", help="repository (default: .)")
    p.add_argument("--fact", action="append", metavar="ID", help="only this fact (repeatable)")
    p.add_argument("--rev", default="HEAD", help="revision whose files are read (default: HEAD)")
    p.add_argument("--config", metavar="FILE", help="read the config from FILE")
    p.add_argument("--format", choices=("text", "json"), default="text")
    adhoc = p.add_argument_group("try a fact without a config (all three of --files, --lang and --query/--regex)")
    adhoc.add_argument("--query", help="tree-sitter query with a @key capture")
    adhoc.add_argument("--regex", help="regex with a (?P<key>...) group")
    adhoc.add_argument("--lang", choices=("python", "c", "cpp", "cuda", "regex"), help="grammar for --query")
    adhoc.add_argument("--files", action="append", metavar="GLOB", help="files to read (repeatable)")
    tree = p.add_argument_group("see the parse tree a query runs on")
    tree.add_argument("--tree", metavar="FILE",
                      help="print FILE's parse tree (node types, field names, positions); FILE is read from the "
                      "disk when it exists there, else from --rev; --lang overrides the grammar its extension picks")
    tree.add_argument("--at", metavar="LINE:COL", help="with --tree: mark the node at LINE:COL (1-based) and print "
                      "a query that captures it as @key")
    p.set_defaults(handler=run)


def _load(args, repo, sha):
    from pathlib import Path

    from checks.config import CONFIG_PATH, load_config, parse_config

    path: Path | None = None
    if args.config:
        path = Path(args.config)
    elif repo.working_dir:
        path = Path(repo.working_dir) / CONFIG_PATH
    if path is not None and path.is_file():
        return parse_config(path.read_text(encoding="utf-8"), str(path))
    if args.config:
        raise FileNotFoundError(f"{args.config}: no such file")
    return load_config(repo, sha)


def run(args: argparse.Namespace) -> int:
    import json

    from checks.config import CONFIG_PATH, ConfigError, Fact
    from checks.facts import FactError, extract
    from checks.workspace import Tree, WorkspaceError, open_repo, resolve

    if args.tree:
        return _tree(args)
    if args.at:
        print("drift-audit facts: --at needs --tree FILE", file=sys.stderr)
        return 2
    adhoc = bool(args.query or args.regex)
    if adhoc and not args.files:
        print("drift-audit facts: --query/--regex needs --files GLOB", file=sys.stderr)
        return 2
    try:
        repo = open_repo(args.path)
        sha = resolve(repo, args.rev)
        config = None if adhoc else _load(args, repo, sha)
    except (WorkspaceError, ConfigError, FileNotFoundError) as exc:
        print(f"drift-audit facts: {exc}", file=sys.stderr)
        return 2
    if adhoc:
        lang = args.lang or ("regex" if args.regex and not args.query else "")
        if not lang:
            print("drift-audit facts: --query needs --lang python|c|cpp|cuda", file=sys.stderr)
            return 2
        facts = [Fact(id="adhoc", lang=lang, files=args.files, query=args.query, regex=args.regex)]
    else:
        assert config is not None  # loaded above whenever the facts are not ad hoc
        facts = config.facts
    if args.fact and config is not None:
        known = {f.id for f in facts}
        unknown = [f for f in args.fact if f not in known]
        if unknown:
            print(
                f"drift-audit facts: no fact {', '.join(map(repr, unknown))} in {config.source}; "
                f"facts: {', '.join(sorted(known)) or 'none'}",
                file=sys.stderr,
            )
            return 2
        facts = [f for f in facts if f.id in args.fact]
    if not facts and config is not None:  # "nothing declared" must not look like "declared facts matched nothing"
        print(f"drift-audit facts: no [[fact]] in {config.source}; declare facts in {CONFIG_PATH} (docs/rules.md), "
              "try one with --files GLOB --lang LANG --query/--regex, or run `drift-audit infer` to see what "
              "this repository's code suggests", file=sys.stderr)
    tree = Tree(str(repo.working_dir or repo.git_dir), sha)
    status = 0
    dump = []
    for fact in facts:
        try:
            result = extract(fact, tree)
        except FactError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        if args.format == "json":
            dump.append(
                {
                    "fact": fact.id,
                    "files": result.files,
                    "problems": result.problems,
                    "rows": [
                        {"key": r.key, "values": {k: str(v) for k, v in r.values.items()}, "path": r.path, "line": r.line}
                        for r in result.rows
                    ],
                }
            )
            continue
        print(f"# {fact.id}: {len(result.rows)} row(s) from {len(result.files)} file(s)")
        for r in result.rows:
            values = "  ".join(f"{k}={v}" for k, v in r.values.items())
            print(f"{r.key}\t{values}\t{r.path}:{r.line}" if values else f"{r.key}\t{r.path}:{r.line}")
        for problem in result.problems:
            print(f"  ! {problem}")
        if not result.files:
            print(f"  ! files = {fact.files} selects no file at {args.rev}")
    if args.format == "json":
        print(json.dumps(dump, indent=2))
    return status


def _tree(args: argparse.Namespace) -> int:
    """``--tree FILE [--at LINE:COL]``."""
    from pathlib import Path

    from checks.syntax import LANGS, lang_for_path
    from checks.treeview import TreeError, render
    from checks.workspace import Tree, WorkspaceError, open_repo, resolve

    lang = args.lang or lang_for_path(args.tree)
    if lang not in LANGS:
        print(f"drift-audit facts: no grammar for {args.tree}; pass --lang {'|'.join(LANGS)}", file=sys.stderr)
        return 2
    at = None
    if args.at:
        try:
            line, col = (int(part) for part in args.at.split(":"))
            at = (line, col)
        except ValueError:
            print(f"drift-audit facts: --at {args.at}: write LINE:COL, e.g. --at 12:5", file=sys.stderr)
            return 2
    on_disk = Path(args.tree)
    if on_disk.is_file():
        data = on_disk.read_bytes()
    else:
        try:
            repo = open_repo(args.path)
            sha = resolve(repo, args.rev)
        except WorkspaceError as exc:
            print(f"drift-audit facts: {args.tree}: not a file here, and {exc}", file=sys.stderr)
            return 2
        blob = Tree(str(repo.working_dir or repo.git_dir), sha).read(args.tree)
        if blob is None:
            print(f"drift-audit facts: {args.tree}: no such file on disk or at {args.rev}", file=sys.stderr)
            return 2
        data = blob
    try:
        for text in render(lang, data, at):
            print(text)
    except TreeError as exc:
        print(f"drift-audit facts: {args.tree}: {exc}", file=sys.stderr)
        return 2
    return 0
