"""``drift-audit infer`` prints what inference believes; ``drift-audit init`` writes it down as a config.

``init`` proposes ``.github/drift-audit.toml`` for a repo that has none: pillars
from the top-level layout, the strongest inferred invariants as declared facts
and rules (each with its evidence as a comment), and suites from the test files
and what they import. Every proposed rule is evaluated at HEAD before it is
written, and the written file is parsed back, so the proposal loads and holds.
A maintainer curates it instead of writing tree-sitter queries from nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import Any

MAX_RULES = 40


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "infer",
        help="print the invariants inferred from a revision, with their support",
        description="Mine the name families a repo writes down in several files (enums, switches, tables, "
        "registrations) and print the relations that hold, with support and example rows.",
    )
    p.add_argument("path", nargs="?", default=".", help="repository (default: .)")
    p.add_argument("--rev", default="HEAD", help="revision to read (default: HEAD)")
    p.add_argument("--min-support", type=int, default=4, help="names a relation must hold (default: 4)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=run_infer)
    q = subparsers.add_parser(
        "init",
        help="write a proposed .github/drift-audit.toml from the repo's layout, invariants and tests",
        description="Propose a config: pillars from the layout, declared rules for the strongest inferred "
        "invariants (with their evidence), suites from the test files. Refuses to overwrite unless --force.",
    )
    q.add_argument("path", nargs="?", default=".", help="repository (default: .)")
    q.add_argument("--rev", default="HEAD", help="revision to read (default: HEAD)")
    q.add_argument("--output", metavar="FILE", help="where to write (default: PATH/.github/drift-audit.toml; - for stdout)")
    q.add_argument("--force", action="store_true", help="overwrite an existing file")
    q.add_argument("--max-rules", type=int, default=MAX_RULES, help=f"invariants to propose (default: {MAX_RULES})")
    q.set_defaults(handler=run_init)


def _open(path: str, rev: str):
    from checks.workspace import Tree, open_repo, resolve

    repo = open_repo(path)
    sha = resolve(repo, rev)
    return repo, Tree(str(repo.working_dir or repo.git_dir), sha)


def run_infer(args: argparse.Namespace) -> int:
    from checks.infer import infer, repo_cache_dir
    from checks.workspace import WorkspaceError

    try:
        _, tree = _open(args.path, args.rev)
    except WorkspaceError as exc:
        print(f"drift-audit infer: {exc}", file=sys.stderr)
        return 2
    if args.min_support < 2:
        print("drift-audit infer: --min-support must be at least 2", file=sys.stderr)
        return 2
    out = infer(tree, cache_dir=repo_cache_dir(tree.repo_path), min_support=args.min_support)
    if args.format == "json":
        print(json.dumps([{"id": r.id, "kind": r.kind, "facts": r.facts, "summary": line, "evidence": r.evidence}
                          for r, line in zip(out.rules, out.lines)], indent=2))
        return 0
    if not out.rules:
        print(f"No invariant found at {tree.sha[:12]}: no list of names (enum, switch, table, registration) with at "
              f"least {args.min_support} names is kept in step across files, so a review with no config has no "
              "inferred rule to check. --min-support N lowers the bar.")
        return 0
    n = len(out.rules)
    print(f"{n} invariant{'s' if n > 1 else ''} inferred from the code at {tree.sha[:12]} (no config needed): each is a "
          "set of lists that held the same names there.\nA pull request that adds or removes a name in one list of a "
          "set and not in the others gets a finding.")
    for i, (rule, line) in enumerate(zip(out.rules, out.lines, strict=True), 1):
        summary = line.split(": ", 1)[-1]
        print(f"\n{i}. {summary}\n   id: {rule.id}")
        for e in rule.evidence:
            if not e.startswith("support "):  # the line above says it
                print(f"   {e}")
    print("\nNext: `drift-audit init` writes these down as .github/drift-audit.toml for you to edit; to silence one "
          "without a config file, list its id under [settings] disable.")
    return 0


def run_init(args: argparse.Namespace) -> int:
    from checks.config import CONFIG_PATH, ConfigError
    from checks.workspace import WorkspaceError

    try:
        repo, tree = _open(args.path, args.rev)
    except WorkspaceError as exc:
        print(f"drift-audit init: {exc}", file=sys.stderr)
        return 2
    root = Path(repo.working_dir or args.path)
    target = None if args.output == "-" else Path(args.output) if args.output else root / CONFIG_PATH
    if target is not None and target.exists() and not args.force:
        print(f"drift-audit init: {target} exists; pass --force to overwrite or --output FILE", file=sys.stderr)
        return 2
    try:
        text, counts = propose(tree, max_rules=args.max_rules)
    except ConfigError as exc:  # the proposal must load; this is a bug, said plainly
        print(f"drift-audit init: the proposed config does not load: {exc}", file=sys.stderr)
        return 1
    if target is None:
        sys.stdout.write(text)
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(_init_said(target, counts))
    return 0


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _init_said(target: Path, counts: dict[str, int]) -> str:
    """What `init` wrote and what to do next; a config with no rule says so instead of asking to prune rules."""
    head = (f"wrote {target}: {_n(counts['pillars'], 'pillar')}, {_n(counts['rules'], 'rule')} over "
            f"{_n(counts['facts'], 'fact')}, {_n(counts['suites'], 'suite')}.")
    if not counts["rules"]:
        return (f"{head}\nNo rule was proposed: no list of names (enum, switch, table, registration) with at least "
                "4 names is kept in step across files here. The file maps pillars and suites only; commit it if they "
                "suit you. With no rule declared, reviews keep inferring rules from the base as the code grows.")
    return (f"{head}\nNext: read it (a comment above each rule says why it was proposed), delete the rules that are "
            "not real invariants, and commit it. With rules declared, reviews check these rules instead of inferring "
            "their own ([settings] infer = true keeps both).")


# --------------------------------------------------------------------------- the proposal


def propose(tree: Any, max_rules: int = MAX_RULES) -> tuple[str, dict[str, int]]:
    """The config text for ``tree`` and what it holds; raises ConfigError if it would not load."""
    from checks.audit import evaluate_tree
    from checks.config import Config, Pillar, parse_config
    from checks.infer import infer, repo_cache_dir

    builtin, pillars = _layout_pillars(tree.paths())
    cfg_pillars = ([Pillar(b.id, b.title, b.paths, b.symbols) for b, _ in builtin]
                   + [Pillar(p["id"], p["title"], p["paths"]) for p in pillars] + [Pillar("other", "Other")])
    inferred = infer(tree, cfg_pillars, cache_dir=repo_cache_dir(tree.repo_path), severity="error")
    chosen = list(zip(inferred.rules, inferred.lines))[:max_rules]
    facts_by_id = {f.id: f for f in inferred.facts}
    suites = _suites(tree)
    out = [
        "# Drift Audit config proposed by `drift-audit init` from "
        f"{tree.sha[:12]}. Review it: keep the rules that state what\n"
        "# the code must keep in step, delete the rest. docs/rules.md explains facts and rules; docs/inference.md\n"
        "# how these were found. Every rule below held at that commit.\n",
    ]
    for b, claimed in builtin:
        seen = f"{len(claimed)} file(s) here by path" + (f", e.g. {', '.join(claimed[:3])}" if claimed else "")
        out.append(f"\n# built-in pillar: {seen}\n"
                   f"[[pillar]]\nid = {_s(b.id)}\ntitle = {_s(b.title)}\npaths = {_list(b.paths)}\n"
                   + (f"symbols = {_list(b.symbols)}\n" if b.symbols else ""))
    for p in pillars:
        out.append(f"\n# most source files under {p['paths'][0]} fit no built-in pillar\n"
                   f"[[pillar]]\nid = {_s(p['id'])}\ntitle = {_s(p['title'])}\npaths = {_list(p['paths'])}\n")
    ids = _short_ids([r for r, _ in chosen])
    taken: set[str] = set()
    for rule, line in chosen:
        rid = ids[rule.id]
        summary = line.split(": ", 1)[-1]
        out.append(f"\n# {summary}\n")
        out += [f"#   {e}\n" for e in rule.evidence]
        names: dict[str, str] = {}
        for fid in rule.facts:
            fact = facts_by_id[fid]
            names[fid] = _fact_name(fid, taken)  # a plain identifier: operands are FACT.FIELD
            out.append(_fact_toml(fact, names[fid]))
        out.append(_rule_toml(rule, rid, names, re.sub(r" \(\d+ names?, \d+ files?\)$", "", summary)))
    for s in suites:
        out.append(f"\n[[suite]]\nid = {_s(s['id'])}\nkind = \"unit\"\ncommand = {_s(s['command'])}\n"
                   f"paths = {_list(s['paths'])}\n")
    text = "".join(out)
    config = parse_config(text, "proposed .github/drift-audit.toml")
    config = Config(pillars=config.pillars, facts=config.facts, rules=config.rules, suites=config.suites,
                    settings=config.settings, source=config.source)
    side = evaluate_tree(config, tree)
    failing = {f.rule for f in side.findings} | set(side.skipped_rules)
    if failing:  # a renamed fact must still read what it read under its inferred id; drop any that does not
        text = _drop(text, failing)
        config = parse_config(text, "proposed .github/drift-audit.toml")
    counts = {"pillars": len(builtin) + len(pillars), "rules": len(config.rules), "facts": len(config.facts), "suites": len(suites)}
    return text, counts


def _short_ids(rules) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in rules:
        base = re.sub(r"^inferred-", "", r.id)
        base = re.sub(r"-[0-9a-f]{6}$", "", base).lower().replace("_", "-")
        rid, n = base, 2
        while rid in out.values():
            rid, n = f"{base}-{n}", n + 1
        out[r.id] = rid
    return out


def _fact_toml(fact, fid: str) -> str:
    # a regex fact (CMake source lists, Cython enums, includes) is written as one; an empty query would not parse
    read = f"regex = {_raw(fact.regex)}" if fact.regex and not fact.query else f"query = {_raw(fact.query)}"
    lines = [f"\n[[fact]]\nid = {_s(fid)}\nlang = {_s(fact.lang)}\nfiles = {_list(fact.files)}\n{read}\n"]
    for k, v in fact.options.items():
        lines.append(f"{k} = {_value(v)}\n")
    return "".join(lines)


def _fact_name(fid: str, taken: set[str]) -> str:
    """A fact's name in the written config, from what it reads: ``enum:OpKind@csrc/ops.h`` → ``enum_OpKind``."""
    kind, _, rest = fid.partition(":")
    ctx = rest.rsplit("@", 1)[0] if "@" in rest else rest
    ctx, _, label = ctx.partition("[")  # case:f[GGML_OP_*] → case_f_GGML_OP; py-functions:<module>[apply_*] → …_apply
    ctx = "_".join(x for x in (ctx.replace("<module>", ""), label.rstrip("]*")) if x)
    order = "_order" if fid.endswith("#order") else ""
    base = re.sub(r"\W+", "_", f"{kind}_{ctx}{order}" if ctx else fid).strip("_") or "fact"
    if base[0].isdigit():
        base = "f_" + base
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _rule_toml(rule, rid: str, names: dict[str, str], message: str = "") -> str:
    text = (f"\n[[rule]]\nid = {_s(rid)}\nkind = {_s(rule.kind)}\nfacts = {_list([names[f] for f in rule.facts])}\n"
            f"pillar = {_s(rule.pillar)}\nseverity = \"error\"\n")
    if message:
        text += f"message = {_s(message)}\n"
    for k, v in rule.options.items():
        if k == "extra_ok":
            v = [names[f] for f in v]
        elif k == "exceptions":
            v = {names[f]: keys for f, keys in v.items()}
        elif k == "equal":
            v = [names[ref.rpartition(".")[0]] + "." + ref.rpartition(".")[2] for ref in v]
        text += f"{k} = {_value(v)}\n"
    return text


def _drop(text: str, rule_ids: set[str]) -> str:
    """Remove the [[rule]] blocks with these ids, with the comment and the facts written for them."""
    blocks = re.split(r"(?m)^(?=\n?# |\[\[)", text)
    keep: list[str] = []
    pending: list[str] = []  # a rule's comment and facts, written before it
    for b in blocks:
        if b.startswith("[[rule]]"):
            m = re.search(r'(?m)^id = "([^"]+)"', b)
            if not (m and m.group(1) in rule_ids):
                keep += pending + [b]
            pending = []
        elif b.startswith(("[[pillar]]", "[[suite]]")):
            keep += pending + [b]
            pending = []
        else:
            pending.append(b)
    return "".join(keep + pending)


def _raw(value: str | None) -> str:
    """A TOML literal string (no escapes to read), multi-line for a multi-pattern query."""
    text = value or ""
    if "\n" in text and "\'\'\'" not in text:
        return "\'\'\'\n" + text + "\'\'\'"
    if "'" not in text and "\n" not in text:
        return "'" + text + "'"
    return _s(text)


def _s(value: str | None) -> str:
    return json.dumps(value or "")  # a JSON string is a valid TOML basic string


def _list(values: list[str]) -> str:
    return "[" + ", ".join(_s(v) for v in values) + "]"


def _value(v: Any) -> str:
    if isinstance(v, str):
        return _raw(v) if "\\" in v else _s(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _s(k)


_SKIP_TOP = {"tests", "test", "docs", "doc", "examples", "example", "benchmarks", "scripts", "third_party", "3rdparty",
             "vendor", "build", "dist", ".github", "cmake"}


def _layout_pillars(paths: list[str]) -> tuple[list[tuple[Any, list[str]]], list[dict]]:
    """The built-in pillars that claim files of this layout (a repo that declares pillars gets only those it
    declares, so the checklist's split must be written out), and a directory pillar for each source tree whose
    files mostly fit none of them (they would land in Other)."""
    from checks import syntax
    from checks.config import default_config
    from checks.pillars import PillarMatcher

    builtin = [p for p in default_config().pillars if p.id != "other"]
    matcher = PillarMatcher(builtin)
    claimed: dict[str, list[str]] = defaultdict(list)
    unclaimed: set[str] = set()
    for path in paths:
        if syntax.lang_for_path(path) is None:
            continue
        hits = matcher.by_path(path)
        for pid, _ in hits:
            claimed[pid].append(path)
        if not hits:
            unclaimed.add(path)
    kept = [(p, claimed[p.id]) for p in builtin if claimed[p.id] or p.symbols]  # symbols claim by what files define
    dirs = []
    for d in _pillars(paths):
        under = [x for x in paths if x.startswith(d["paths"][0][:-2]) and syntax.lang_for_path(x)]
        if under and sum(x in unclaimed for x in under) * 2 > len(under):
            dirs.append(d)
    return kept, dirs


def _pillars(paths: list[str]) -> list[dict]:
    """One pillar per top-level source directory (or per package of a single top-level package)."""
    from checks import syntax

    counts: dict[str, int] = defaultdict(int)
    for p in paths:
        parts = PurePosixPath(p).parts
        if len(parts) < 2 or parts[0] in _SKIP_TOP or parts[0].startswith(".") or syntax.lang_for_path(p) is None:
            continue
        counts[parts[0]] += 1
    tops = [d for d, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n >= 2][:8]
    if len(tops) == 1:  # one package: its sub-packages are the pillars
        sub: dict[str, int] = defaultdict(int)
        for p in paths:
            parts = PurePosixPath(p).parts
            if len(parts) >= 3 and parts[0] == tops[0] and syntax.lang_for_path(p):
                sub["/".join(parts[:2])] += 1
        subs = [d for d, n in sorted(sub.items(), key=lambda kv: -kv[1]) if n >= 2][:8]
        if len(subs) >= 2:
            tops = subs
    return [{"id": re.sub(r"[^a-z0-9]+", "-", d.lower()).strip("-") or "src", "title": d,
             "paths": [f"{d}/**"]} for d in sorted(tops)]


_TEST_FILE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py)$")


def _suites(tree: Any) -> list[dict]:
    """One pytest suite per directory of test files, selected by the source trees its tests import."""
    from runner.imports import parse_imports

    paths = tree.paths()
    tops = {PurePosixPath(p).parts[0] for p in paths if len(PurePosixPath(p).parts) > 1}
    groups: dict[str, list[str]] = defaultdict(list)
    for p in paths:
        if _TEST_FILE.search(p):
            groups[str(PurePosixPath(p).parent)].append(p)
    out = []
    for folder, files in sorted(groups.items()):
        reached: set[str] = set()
        for f in files:
            data = tree.read(f) or b""
            for imp in parse_imports(f, data):
                head = imp.module.split(".")[0]
                if head in tops and head not in _SKIP_TOP:
                    reached.add(f"{head}/**")
        sid = re.sub(r"[^a-z0-9]+", "-", folder.lower()).strip("-") or "tests"
        out.append({"id": sid, "command": f"python -m pytest -q {folder}", "paths": sorted(reached | {f"{folder}/**"})})
    return out


__all__ = ["register", "propose"]
