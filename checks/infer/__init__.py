"""Invariants inferred from the base tree: rules for repos that declared none.

``infer(tree)`` collects name families (checks/infer/families.py), mines the
relations that hold across files (checks/infer/mine.py) and turns the strong
ones into ``Fact``/``Rule`` objects (checks/infer/rules.py). Every candidate is
evaluated once on the base through the rule engine and kept only if it holds
there with no finding, so an inferred rule never reports what the base already
did. Results are cached on disk per set of source blobs: the same base tree
is mined once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.config import Config, Fact, Pillar, Rule
from checks.infer.entry_points import entry_point_rule, manifest_entry_points, manifests
from checks.infer.families import VERSION, BlobCache, source_files, tree_members
from checks.infer.mine import build_families, counted_families, mine, mine_counts, named_constants, self_named
from checks.infer.numbers import indexed_rule, indexed_tables, mine_sizes, size_families, size_rule
from checks.infer.rules import count_rule, named_rule, self_named_rule, summary, to_config
from checks.infer.sources import export_lists, export_rule, sibling_imports, sibling_rule, source_lists, source_rule

MIN_SUPPORT = 4


@dataclass
class Inferred:
    """The inferred part of a config, and one line per invariant for the report."""

    facts: list[Fact] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # parallel to rules
    timings: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    labels: dict[str, str] = field(default_factory=dict)  # fact id → the family in words, for findings


def cache_root(setting: str = "") -> Path:
    """Where inference keeps its per-repo caches: [settings] cache_dir, $DRIFT_AUDIT_CACHE, else XDG."""
    base = setting or os.environ.get("DRIFT_AUDIT_CACHE") or ""
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "drift-audit")
    return Path(base)


@functools.cache
def code_digest() -> str:
    """A digest of the inference code itself: a result mined by another version of it is not reused, even where
    nobody bumped VERSION (which guards the cached rows of each file, not the mining over them)."""
    h = hashlib.sha1()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def repo_cache_dir(repo_path: str, setting: str = "") -> Path:
    """One directory per repository (by its absolute path), so a bot serving many repos keeps them apart."""
    key = hashlib.sha1(os.path.abspath(repo_path).encode()).hexdigest()[:16]
    return cache_root(setting) / "infer" / key


def infer(
    tree: Any,
    pillars: list[Pillar] | None = None,
    *,
    cache_dir: Path | None = None,
    min_support: int = MIN_SUPPORT,
    severity: str = "warning",
    verify: bool = True,
) -> Inferred:
    """Inferred facts and rules for one tree (a checks.workspace.Tree), strongest first."""
    pillars = pillars or []
    t0 = time.perf_counter()
    declared = manifests(tree)
    files = source_files(tree) + declared
    key = hashlib.sha1(
        json.dumps([VERSION, code_digest(), min_support, severity, verify, [p.id for p in pillars],
                    files]).encode()
    ).hexdigest()[:20]
    result_path = cache_dir / f"inferred-{key}.json" if cache_dir else None
    if result_path is not None and result_path.is_file():
        try:
            out = _load(result_path)
            out.cached = True
            out.timings["load"] = time.perf_counter() - t0
            return out
        except Exception:  # a torn or foreign cache entry is recomputed
            pass
    cache = BlobCache(cache_dir)
    members = tree_members(tree, cache)
    cache.save(keep={b for _, _, b in files})
    t1 = time.perf_counter()
    families = build_families(members, min_size=min_support)
    invariants = mine(families, min_support)
    counts = mine_counts(counted_families(members, min_support), min_support)
    named = self_named(families, min_support)
    handed = named_constants(members, min_support)
    lists = source_lists(members, tree.paths(), min_support)
    exports = export_lists(members, min_support)
    registrars = sibling_imports(members, tree.paths(), min_support)
    sizes = mine_sizes(size_families(members))
    indexed = indexed_tables(members, families)
    scripts = manifest_entry_points(tree, declared)
    t2 = time.perf_counter()
    out = Inferred()
    for inv in invariants:
        facts, rule = to_config(inv, pillars, severity)
        for fam, fact in zip(inv.families, facts, strict=True):
            out.labels[fact.id] = fam.what()
        known = {f.id for f in out.facts}
        out.facts += [f for f in facts if f.id not in known]
        out.rules.append(rule)
        support = len(inv.core[0].order) if inv.kind == "order-equal" else inv.support
        out.lines.append(f"{rule.id}: {summary(inv)} ({support} names, {inv.files} file{'s' if inv.files > 1 else ''})")
    seen: set[tuple[str, str, str, str]] = set()
    for a, b in counts:
        if (a.path, a.ctx, b.path, b.ctx) in seen:
            continue  # one function set reached by its prefix and by its suffix
        seen.add((a.path, a.ctx, b.path, b.ctx))
        _add(out, *count_rule(a, b, pillars, severity), a.what(), b.what())
    for fam in named:
        _add(out, *self_named_rule(fam, pillars, severity), f"the strings of {fam.what()}",
             f"the keys of {fam.what()}")
    done: set[tuple[str, str, frozenset]] = set()
    for nm in handed:
        fns = frozenset(fn for _, fn, _ in nm.values.values())
        if (nm.path, nm.callee, fns) in done:
            continue  # one function set reached by its prefix and by its suffix
        done.add((nm.path, nm.callee, fns))
        _add(out, *named_rule(nm, pillars, severity), f"the constants functions {nm.affix} hand {nm.callee}()")
    for sl in lists:
        _add(out, *source_rule(sl, pillars, severity), f"the source files {sl.path} names",
             "among the tree's " + ", ".join(f"*.{e}" for e in sl.exts) + " files")
    for ex in exports:
        _add(out, *export_rule(ex, pillars, severity), f"the names {ex.path} imports from its package",
             f"__all__ of {ex.path}")
    for small, bigger in sizes:
        _add(out, *size_rule(small, bigger, pillars, severity), small.what(), *(b.what() for b in bigger))
    for ix in indexed:
        _add(out, *indexed_rule(ix, pillars, severity), ix.enum.what(), ix.table.what())
    for si in registrars:
        _add(out, *sibling_rule(si, pillars, severity),
             f"the modules {si.path} (or another module of {si.directory or '.'}/) imports",
             f"the modules of {si.directory or '.'}/")
    for ep in scripts:
        _add(out, *entry_point_rule(ep, pillars, severity), f"the entry points of {ep.path}",
             "the module-level names of " + ", ".join(f"{ep.root}{p}" for p in ep.packages))
    if verify and out.rules:
        _keep_holding(out, tree, pillars)
    t3 = time.perf_counter()
    out.timings = {"members": t1 - t0, "mine": t2 - t1, "verify": t3 - t2, "families": float(len(families))}
    if result_path is not None:
        _save(result_path, out)
    return out


def _add(out: Inferred, facts: list, rule: Any, line: str, *labels: str) -> None:
    """One mined rule into ``out``: its facts (a fact two rules share is kept once), the labels of its first
    facts in order, the rule and its line."""
    for fact, label in zip(facts, labels, strict=False):
        out.labels[fact.id] = label
    known = {f.id for f in out.facts}
    out.facts += [f for f in facts if f.id not in known]
    out.rules.append(rule)
    out.lines.append(line)


def _keep_holding(out: Inferred, tree: Any, pillars: list[Pillar]) -> None:
    """Drop every candidate the rule engine does not see holding on this tree."""
    from checks.audit import evaluate_tree

    config = Config(pillars=pillars or [Pillar("other", "Other")], facts=out.facts, rules=out.rules)
    side = evaluate_tree(config, tree)
    bad = set(side.skipped_rules) | {f.rule for f in side.findings}
    keep = [i for i, r in enumerate(out.rules) if r.id not in bad]
    out.rules = [out.rules[i] for i in keep]
    out.lines = [out.lines[i] for i in keep]
    used = {f for r in out.rules for f in r.facts}
    out.facts = [f for f in out.facts if f.id in used]
    out.labels = {k: v for k, v in out.labels.items() if k in used}


def _save(path: Path, out: Inferred) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "facts": [dataclasses.asdict(f) for f in out.facts],
            "rules": [dataclasses.asdict(r) for r in out.rules],
            "lines": out.lines,
            "labels": out.labels,
        }
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
        old = sorted(path.parent.glob("inferred-*.json"), key=lambda p: p.stat().st_mtime)
        for stale in old[:-16]:
            stale.unlink(missing_ok=True)
    except OSError:
        pass


def _load(path: Path) -> Inferred:
    data = json.loads(path.read_text())
    return Inferred(
        facts=[Fact(**f) for f in data["facts"]], rules=[Rule(**r) for r in data["rules"]], lines=list(data["lines"]),
        labels=dict(data.get("labels", {})),
    )


# --------------------------------------------------------------------------- declared wins


def _names(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def declared_cover(config: Config, inferred: Inferred, tree: Any) -> Inferred:
    """Drop the inferred rules a declared rule already states: the declared one wins.

    An inferred rule is covered when one declared rule reads rows from at least two
    of its files and those rows hold at least half of its names.
    """
    from checks.facts import FactError, extract

    if not config.rules:
        return inferred
    by_id = {f.id: f for f in config.facts}
    declared: list[tuple[set[str], set[str]]] = []
    for rule in config.rules:
        paths: set[str] = set()
        keys: set[str] = set()
        for fid in rule.facts:
            fact = by_id.get(fid)
            if fact is None:
                continue
            try:
                rows = extract(fact, tree).rows
            except (FactError, Exception):
                continue
            paths.update(r.path for r in rows)
            keys.update(_names(r.key) for r in rows)
        declared.append((paths, keys))
    inferred_facts = {f.id: f for f in inferred.facts}
    keep: list[int] = []
    for i, rule in enumerate(inferred.rules):
        files = {p for fid in rule.facts for p in inferred_facts[fid].files if "*" not in p}
        try:
            names = {r.key for r in extract(inferred_facts[rule.facts[0]], tree).rows}
        except Exception:
            names = set()
        covered = False
        for paths, keys in declared:
            if len(files & paths) >= 2 and names:
                shared = sum(1 for n in names if n in keys or any(n in k for k in keys))
                covered = shared * 2 >= len(names)
            if covered:
                break
        if not covered:
            keep.append(i)
    rules = [inferred.rules[i] for i in keep]
    used = {f for r in rules for f in r.facts}
    return Inferred(
        facts=[f for f in inferred.facts if f.id in used],
        rules=rules,
        lines=[inferred.lines[i] for i in keep],
        timings=inferred.timings,
        cached=inferred.cached,
        labels={k: v for k, v in inferred.labels.items() if k in used},
    )


__all__ = ["Inferred", "infer", "declared_cover", "cache_root", "repo_cache_dir"]
