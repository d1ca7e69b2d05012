"""The checks stage: evaluate every rule on base and head and sort findings into
new / changed / no-baseline / improved / pre-existing / fixed.

A PR should be blamed only for what it changed, so rules run on the merge-base
tree too and findings are matched by identity (rule + the keys involved + the
place pair of a relation, never line numbers, which move with every edit above
them), then compared by state (what is wrong). Base and head share most blobs,
so facts extracted per blob (checks/facts.py, cached on disk by checks/factcache.py)
make the second side nearly free.

Bad input never stops the audit: a query that does not compile, a fact that
matches nothing or a file that does not parse becomes an ``Unchecked`` entry
naming the config entry, and every other rule still runs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

from checks.config import Config, Fact, Rule, parse_config
from checks.factcache import fact_cache
from checks.facts import (
    FactError,
    FactResult,
    Limits,
    Row,
    compile_fact,
    extract,
    input_digest,
    parse_parallel,
    prefetch,
)
from checks.globs import compile_globs
from checks.infer.hook import with_inference
from checks.model import ChangeSet, Checkout, Finding, Findings, Location, Unchecked, to_dict
from checks.rules.base import missing_of
from checks.workspace import Tree


@dataclass
class SideResult:
    """What the rules gave on one tree."""

    findings: list[Finding] = field(default_factory=list)
    unchecked: list[Unchecked] = field(default_factory=list)
    skipped_rules: set[str] = field(default_factory=set)  # rules that could not run on this side
    rows: dict[str, list[Row]] = field(default_factory=dict)


def _entry(kind: str, entry_id: str, line: int, source: str) -> str:
    where = f" ({source}:{line})" if line else f" ({source})"
    return f"{kind} '{entry_id}'{where}"


@lru_cache(maxsize=32)
def _pack(name: str) -> tuple[dict[str, Fact], dict[str, Rule]]:
    from importlib import resources

    text = resources.files("checks.packs").joinpath(f"{name}.toml").read_text()
    pack = parse_config(text, f"rule pack '{name}'")
    return {f.id: f for f in pack.facts}, {r.id: r for r in pack.rules}


def _source_of(config: Config, entry: Fact | Rule) -> str:
    """Where an entry was written: the repo config, or the built-in pack it came from unchanged."""
    for name in config.settings.packs:
        try:
            facts, rules = _pack(name)
        except Exception:
            continue
        if isinstance(entry, Fact) and facts.get(entry.id) == entry:
            return f"checks/packs/{name}.toml"
        if isinstance(entry, Rule) and entry.source == "pack" and entry.id in rules:
            return f"checks/packs/{name}.toml"
    return config.source


_PROBLEM = re.compile(r"^(?P<path>.*?):(?P<line>\d+): (?P<what>.*)$", re.S)


def evaluate_tree(config: Config, tree: Tree) -> SideResult:
    """Extract every fact a rule uses and evaluate every rule over one tree."""
    from checks.rules import REGISTRY

    side = SideResult()
    inputs: dict[str, tuple[str, str]] = {}  # fact id → (signature, digest of the blobs it read)
    broken: dict[str, str] = {}  # fact id → why its rules cannot run
    quiet: set[str] = set()  # optional facts that selected nothing: their rules are skipped silently
    facts: dict[str, Fact] = {f.id: f for f in config.facts}
    nodes = frozenset(f for r in config.rules if (k := REGISTRY.get(r.kind)) is not None and k.nodes for f in r.facts)
    limits = Limits(max_bytes=config.settings.max_file_bytes, cache=fact_cache(config.settings.cache_dir, tree.repo_path), nodes=nodes)
    used = {f for r in config.rules for f in r.facts}
    wanted = [f for f in config.facts if f.id in used or not config.rules]
    for fact in wanted:  # what each fact will read, from the tree listing alone
        try:
            inputs[fact.id] = (compile_fact(fact).signature, input_digest(fact, tree))
        except FactError:
            pass  # reported below, when the fact is extracted
    # Rules whose findings are cached (in memory, or on disk from an earlier process) need no rows.
    done: dict[str, tuple[tuple, list[Finding]]] = {}
    for rule in config.rules:
        if REGISTRY.get(rule.kind) is not None and all(f in inputs for f in rule.facts):
            key = (_rule_signature(rule), tuple(inputs[f] for f in rule.facts))
            hit = _cached_findings(key, limits)
            if hit is not None:
                done[rule.id] = (key, hit)
    need = {f for r in config.rules if r.id not in done for f in r.facts} if config.rules else {f.id for f in wanted}
    data = prefetch([f for f in wanted if f.id in need], tree, limits)
    parse_parallel([f for f in wanted if f.id in need], tree, data, limits)  # cold: a process pool parses
    parse_notes: dict[str, list[tuple[int, str, Fact]]] = {}  # path → (line, what, fact), once per file
    quiet_spec = compile_globs(config.settings.quiet) if config.settings.quiet else None
    for fact in wanted:
        entry = _entry("fact", fact.id, fact.line, _source_of(config, fact))
        summary = _cached_summary(fact, inputs, limits) if fact.id not in need else None
        if summary is None:
            try:
                result: FactResult = extract(fact, tree, data, limits)
            except FactError as exc:
                broken[fact.id] = str(exc)
                side.unchecked.append(Unchecked(entry, str(exc)))
                continue
            except Exception as exc:  # a grammar or I/O failure must not sink the audit
                broken[fact.id] = f"{type(exc).__name__}: {exc}"
                side.unchecked.append(Unchecked(entry, broken[fact.id]))
                continue
            side.rows[fact.id] = result.rows
            inputs[fact.id] = (compile_fact(fact).signature, result.inputs)
            summary = {"files": len(result.files), "rows": len(result.rows), "problems": result.problems}
            if limits.cache is not None:
                limits.cache.store_findings(_summary_key(fact, inputs), [summary])
        for problem in summary["problems"]:
            m = _PROBLEM.match(problem)
            if m and "syntax error" in m["what"]:
                if quiet_spec is None or not quiet_spec.match_file(m["path"]):
                    parse_notes.setdefault(m["path"], []).append((int(m["line"]), m["what"], fact))
            elif not (m and quiet_spec is not None and quiet_spec.match_file(m["path"])):
                side.unchecked.append(Unchecked(entry, problem))
        if not summary["rows"]:
            if not summary["files"] and fact.options.get("optional"):
                broken[fact.id] = "optional fact selects no file"
                quiet.add(fact.id)
                continue
            why = (
                f"matched nothing in {summary['files']} file(s) selected by files = {fact.files}"
                if summary["files"]
                else f"files = {fact.files} selects no file in this tree"
            )
            broken[fact.id] = why
            what = "regex" if fact.regex and not fact.query else "query"
            hint = f"{why}; check the globs and the {what} with `drift-audit facts --fact {fact.id}`"
            side.unchecked.append(Unchecked(entry, hint))
    for path, notes in sorted(parse_notes.items()):
        line, what, first = min(notes, key=lambda n: n[0])
        names = ", ".join(dict.fromkeys(f"'{f.id}'" for _, _, f in notes))
        lang = what.split(" syntax error")[0]
        side.unchecked.append(Unchecked(
            _entry("fact", first.id, first.line, _source_of(config, first)),
            f"{path}:{line}: {lang} syntax error; rows of fact {names} near it may be missing",
        ))
    for rule in config.rules:
        kind = REGISTRY.get(rule.kind)
        blocked = [f for f in rule.facts if f in broken or f not in facts]
        if kind is None or blocked:
            side.skipped_rules.add(rule.id)
            if kind is not None and all(f in quiet for f in blocked):
                continue
            why = f"unknown kind '{rule.kind}'" if kind is None else "; ".join(
                f"fact '{f}' " + (broken.get(f, "is not defined")) for f in blocked
            )
            entry = _entry("rule", rule.id, rule.line, _source_of(config, rule))
            side.unchecked.append(Unchecked(entry, f"not evaluated: {why}"))
            continue
        if rule.id in done:
            side.findings += [_copy(f) for f in done[rule.id][1]]
            continue
        key = (_rule_signature(rule), tuple(inputs[f] for f in rule.facts))
        try:
            found = kind.evaluate(rule, {f: side.rows[f] for f in rule.facts})
            if len(_rule_cache) > 1024:
                _rule_cache.clear()
            _rule_cache[key] = [_copy(f) for f in found]
            if limits.cache is not None:
                limits.cache.store_findings(_findings_key(key), [to_dict(f) for f in found])
            side.findings += found
        except Exception as exc:  # one rule's failure is reported, the others still run
            side.skipped_rules.add(rule.id)
            side.unchecked.append(
                Unchecked(_entry("rule", rule.id, rule.line, _source_of(config, rule)), f"failed: {type(exc).__name__}: {exc}")
            )
    return side


def _findings_key(key: tuple) -> str:
    return hashlib.sha1(json.dumps([FINDINGS_VERSION, *key], default=str).encode()).hexdigest()


def _cached_findings(key: tuple, limits: Limits) -> list[Finding] | None:
    """A rule's findings for these inputs from memory, else from the disk cache (an earlier process)."""
    hit = _rule_cache.get(key)
    if hit is None and limits.cache is not None:
        stored = limits.cache.load_findings(_findings_key(key))
        if stored is not None:
            hit = _rule_cache[key] = [_finding_from(d) for d in stored]
    return hit


def _finding_from(d: dict) -> Finding:
    return Finding(**{**d, "locations": [Location(**loc) for loc in d.get("locations", [])]})


def _summary_key(fact: Fact, inputs: dict[str, tuple[str, str]]) -> str:
    return "fact:" + hashlib.sha1(json.dumps([FINDINGS_VERSION, *inputs[fact.id]]).encode()).hexdigest()


def _cached_summary(fact: Fact, inputs: dict[str, tuple[str, str]], limits: Limits) -> dict | None:
    """How many files and rows a fact had and what it could not read, for a fact whose rules all took
    their findings from the cache (so its rows are never loaded)."""
    if limits.cache is None or fact.id not in inputs:
        return None
    stored = limits.cache.load_findings(_summary_key(fact, inputs))
    return stored[0] if stored else None


# Findings of a rule are a function of the rule and the blobs its facts read, so a
# rule whose inputs did not change since the last audit is not evaluated again (in
# memory, and across processes through the fact cache's findings table).
_rule_cache: dict[tuple, list[Finding]] = {}
FINDINGS_VERSION = 2  # bump when a rule kind's findings change for the same rows


def _rule_signature(rule: Rule) -> str:
    return json.dumps([rule.id, rule.kind, rule.facts, rule.pillar, rule.severity, rule.message, rule.options,
                       rule.source, rule.evidence],
                      sort_keys=True, default=str)


_ORDER = {"new": 0, "changed": 1, "no-baseline": 2, "improved": 3, "pre-existing": 4, "fixed": 5}


def touched_lines(changes: ChangeSet | None) -> dict[str, set[int]]:
    """Head lines the PR added or changed, per path."""
    out: dict[str, set[int]] = {}
    for fc in changes.files if changes is not None else []:
        if fc.status != "deleted":
            out.setdefault(fc.path, set()).update(line for h in fc.hunks for line in h.added)
    return out


def _touches(f: Finding, lines: dict[str, set[int]]) -> bool:
    return any(loc.line in lines.get(loc.path, ()) for loc in f.locations)


def _improved(base_state: str, head_state: str) -> bool:
    was, now = missing_of(base_state), missing_of(head_state)
    return was is not None and now is not None and now < was


def classify(base: SideResult, head: SideResult, changes: ChangeSet | None = None) -> list[Finding]:
    """Match head findings to base findings by identity, then compare their states.

    Same identity and state: pre-existing. Same identity, fewer missing places: improved.
    Same identity, another state: changed (the rows that produce it differ, and only the
    PR changes rows between merge-base and head). A head finding with no base identity is
    new, unless a base finding of the same rule has its exact state (its rows were renumbered,
    not changed). A rule that did not run on base gives no-baseline findings, except where
    the PR touched their lines. Base-only findings are fixed when the rule ran on head.
    """
    lines = touched_lines(changes)
    pool: dict[str, list[Finding]] = {}
    for f in base.findings:
        pool.setdefault(f.fingerprint, []).append(f)
    out: list[Finding] = []
    pending: list[Finding] = []
    for f in head.findings:
        if f.rule in base.skipped_rules:
            f.status = "new" if _touches(f, lines) else "no-baseline"
            out.append(f)
            continue
        match = pool.get(f.fingerprint)
        if not match:
            pending.append(f)
            continue
        b = next((x for x in match if x.state == f.state), match[0])
        match.remove(b)
        if b.state == f.state:
            f.status = "pre-existing"
        elif _improved(b.state, f.state):
            f.status = "improved"
        else:
            f.status = "changed"
        out.append(f)
    left = {(x.rule, x.state): x for xs in pool.values() for x in xs}
    for f in pending:
        was = left.pop((f.rule, f.state), None)
        if was is not None:
            pool[was.fingerprint].remove(was)
        f.status = "pre-existing" if was is not None else "new"
        out.append(f)
    for xs in pool.values():
        for f in xs:
            # A rule that could not run on head proves nothing fixed.
            if f.rule not in head.skipped_rules:
                f.status = "fixed"
                out.append(f)
    severity = {"error": 0, "warning": 1, "note": 2}
    out.sort(key=lambda f: (_ORDER[f.status], severity.get(f.severity, 3), f.rule, f.message))
    return _unique(out)


def _unique(findings: list[Finding]) -> list[Finding]:
    """One finding per (fingerprint, status); the same drift seen twice keeps every location."""
    kept: dict[tuple[str, str], Finding] = {}
    for f in findings:
        first = kept.setdefault((f.fingerprint, f.status), f)
        if first is not f:
            first.locations += [loc for loc in f.locations if loc not in first.locations]
    return list(kept.values())


@with_inference  # checks/infer: inferred rules join the config; co-change notes join the findings
def run_checks(checkout: Checkout, config: Config, changes: ChangeSet) -> Findings:
    """The pipeline's checks stage: rules on merge-base and head, findings classified."""
    fail_on = config.settings.fail_on
    if not config.rules and not config.facts:
        return Findings(fail_on=fail_on)  # type: ignore[arg-type]
    head = evaluate_tree(config, Tree(checkout.repo, checkout.head_sha))
    base_sha = checkout.merge_base_sha or (changes.merge_base_sha if changes else "") or checkout.base_sha
    if not config.rules or (changes is not None and not changes.files):
        base = SideResult(findings=[_copy(f) for f in head.findings])  # nothing changed: all pre-existing
    else:
        base = evaluate_tree(config, Tree(checkout.repo, base_sha))
    ran = [r.id for r in config.rules if r.id not in head.skipped_rules]
    return Findings(findings=classify(base, head, changes), unchecked=head.unchecked, rules_run=ran,
                    fail_on=fail_on)  # type: ignore[arg-type]


def _copy(f: Finding) -> Finding:
    return replace(f, locations=list(f.locations), evidence=list(f.evidence))


__all__ = ["run_checks", "evaluate_tree", "classify", "SideResult"]
