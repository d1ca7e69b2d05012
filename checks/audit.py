"""The checks stage: evaluate every rule on base and head and sort findings into new / pre-existing / fixed.

A PR should be blamed only for what it changed, so rules run on the merge-base
tree too and findings are matched by fingerprint (rule + the keys involved,
never line numbers, which move with every edit above them). Base and head share
most blobs, so facts extracted per blob (checks/facts.py) make the second side
nearly free.

Bad input never stops the audit: a query that does not compile, a fact that
matches nothing or a file that does not parse becomes an ``Unchecked`` entry
naming the config entry, and every other rule still runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from checks.config import Config, Fact, Rule, parse_config
from checks.facts import FactError, FactResult, Row, compile_fact, extract, prefetch
from checks.model import ChangeSet, Checkout, Finding, Findings, Unchecked
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
        if (facts if isinstance(entry, Fact) else rules).get(entry.id) == entry:
            return f"checks/packs/{name}.toml"
    return config.source


def evaluate_tree(config: Config, tree: Tree) -> SideResult:
    """Extract every fact a rule uses and evaluate every rule over one tree."""
    from checks.rules import REGISTRY

    side = SideResult()
    inputs: dict[str, tuple[str, int]] = {}  # fact id → (signature, hash of the blobs it read)
    broken: dict[str, str] = {}  # fact id → why its rules cannot run
    facts: dict[str, Fact] = {f.id: f for f in config.facts}
    data = prefetch(config.facts, tree)
    for fact in config.facts:
        try:
            result: FactResult = extract(fact, tree, data)
        except FactError as exc:
            broken[fact.id] = str(exc)
            side.unchecked.append(Unchecked(_entry("fact", fact.id, fact.line, _source_of(config, fact)), str(exc)))
            continue
        except Exception as exc:  # a grammar or I/O failure must not sink the audit
            broken[fact.id] = f"{type(exc).__name__}: {exc}"
            side.unchecked.append(Unchecked(_entry("fact", fact.id, fact.line, _source_of(config, fact)), broken[fact.id]))
            continue
        side.rows[fact.id] = result.rows
        inputs[fact.id] = (compile_fact(fact).signature, result.inputs)
        for problem in result.problems:
            side.unchecked.append(Unchecked(_entry("fact", fact.id, fact.line, _source_of(config, fact)), problem))
        if not result.rows:
            why = (
                f"matched nothing in {len(result.files)} file(s) selected by files = {fact.files}"
                if result.files
                else f"files = {fact.files} selects no file in this tree"
            )
            broken[fact.id] = why
            what = "regex" if fact.regex and not fact.query else "query"
            hint = f"{why}; check the globs and the {what} with `drift-audit facts --fact {fact.id}`"
            side.unchecked.append(Unchecked(_entry("fact", fact.id, fact.line, _source_of(config, fact)), hint))
    for rule in config.rules:
        kind = REGISTRY.get(rule.kind)
        blocked = [f for f in rule.facts if f in broken or f not in facts]
        if kind is None or blocked:
            why = f"unknown kind '{rule.kind}'" if kind is None else "; ".join(
                f"fact '{f}' " + (broken.get(f, "is not defined")) for f in blocked
            )
            side.skipped_rules.add(rule.id)
            entry = _entry("rule", rule.id, rule.line, _source_of(config, rule))
            side.unchecked.append(Unchecked(entry, f"not evaluated: {why}"))
            continue
        key = (_rule_signature(rule), tuple(inputs[f] for f in rule.facts))
        cached = _rule_cache.get(key)
        if cached is not None:
            side.findings += [_copy(f) for f in cached]
            continue
        try:
            found = kind.evaluate(rule, {f: side.rows[f] for f in rule.facts})
            if len(_rule_cache) > 1024:
                _rule_cache.clear()
            _rule_cache[key] = [_copy(f) for f in found]
            side.findings += found
        except Exception as exc:  # one rule's failure is reported, the others still run
            side.skipped_rules.add(rule.id)
            side.unchecked.append(
                Unchecked(_entry("rule", rule.id, rule.line, _source_of(config, rule)), f"failed: {type(exc).__name__}: {exc}")
            )
    return side


# Findings of a rule are a function of the rule and the blobs its facts read, so a
# rule whose inputs did not change since the last audit is not evaluated again.
_rule_cache: dict[tuple, list[Finding]] = {}


def _rule_signature(rule: Rule) -> str:
    return json.dumps([rule.id, rule.kind, rule.facts, rule.pillar, rule.severity, rule.message, rule.options],
                      sort_keys=True, default=str)


def classify(base: SideResult, head: SideResult) -> list[Finding]:
    """Head findings are new unless base had the same fingerprint; base-only ones are fixed."""
    base_prints = {f.fingerprint for f in base.findings}
    head_prints = {f.fingerprint for f in head.findings}
    out: list[Finding] = []
    for f in head.findings:
        f.status = "pre-existing" if f.fingerprint in base_prints else "new"
        out.append(f)
    for f in base.findings:
        # A rule that could not run on head proves nothing fixed.
        if f.fingerprint not in head_prints and f.rule not in head.skipped_rules:
            f.status = "fixed"
            out.append(f)
    order = {"new": 0, "pre-existing": 1, "fixed": 2}
    severity = {"error": 0, "warning": 1, "note": 2}
    out.sort(key=lambda f: (order[f.status], severity.get(f.severity, 3), f.rule, f.message))
    return _unique(out)


def _unique(findings: list[Finding]) -> list[Finding]:
    """One finding per (fingerprint, status); the same drift seen twice keeps every location."""
    kept: dict[tuple[str, str], Finding] = {}
    for f in findings:
        first = kept.setdefault((f.fingerprint, f.status), f)
        if first is not f:
            first.locations += [loc for loc in f.locations if loc not in first.locations]
    return list(kept.values())


def run_checks(checkout: Checkout, config: Config, changes: ChangeSet) -> Findings:
    """The pipeline's checks stage: rules on merge-base and head, findings classified."""
    if not config.rules and not config.facts:
        return Findings()
    head = evaluate_tree(config, Tree(checkout.repo, checkout.head_sha))
    base_sha = checkout.merge_base_sha or (changes.merge_base_sha if changes else "") or checkout.base_sha
    if not config.rules or (changes is not None and not changes.files):
        base = SideResult(findings=[_copy(f) for f in head.findings])  # nothing changed: all pre-existing
    else:
        base = evaluate_tree(config, Tree(checkout.repo, base_sha))
    return Findings(findings=classify(base, head), unchecked=head.unchecked)


def _copy(f: Finding) -> Finding:
    return Finding(f.rule, f.pillar, f.severity, f.message, list(f.locations), f.status, f.fingerprint)


__all__ = ["run_checks", "evaluate_tree", "classify", "SideResult"]
