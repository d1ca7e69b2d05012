"""What every rule kind shares: the RuleKind record, option checks, value comparison, findings.

A rule kind is data plus two functions, so adding one is a new module and one
line in the registry; config validation and evaluation reach it the same way.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from checks.config import Rule
from checks.facts import Count, Row
from checks.model import Finding, Location

Problem = tuple[str | None, str, str]  # (config key, what is wrong, the fix)
Rows = dict[str, list[Row]]  # fact id → rows


@dataclass(frozen=True)
class RuleKind:
    name: str
    summary: str
    validate: Callable[[Rule], Problem | None]
    evaluate: Callable[[Rule, Rows], list[Finding]]
    # (option, fact, field) of every field the rule reads, so the config can reject a misspelled one.
    refs: Callable[[Rule], list[tuple[str, str, str]]] | None = None
    nodes: bool = False  # reads Row.nodes (syntax nodes), so its facts' rows never come from the disk cache


# --------------------------------------------------------------------------- validation


def check_options(rule: Rule, spec: Mapping[str, Any], required: tuple[str, ...] = ()) -> Problem | None:
    """Unknown, missing or mistyped options → a problem naming the key and the fix."""
    for key, value in rule.options.items():
        if key not in spec:
            known = ", ".join(sorted(spec)) or "none"
            return key, f"unknown option '{key}' for kind '{rule.kind}'", f"options of {rule.kind}: {known}"
        if not isinstance(value, spec[key]):
            want = spec[key] if isinstance(spec[key], tuple) else (spec[key],)
            names = " or ".join(t.__name__ for t in want)
            return key, f"'{key}' must be {names}", f"see docs/rules.md#{rule.kind}"
        if isinstance(value, list) and key not in ("range",) and not all(isinstance(v, str) for v in value):
            return key, f"'{key}' must be a list of strings", f'write {key} = ["..."]'
    for key in required:
        if key not in rule.options:
            return None, f"kind '{rule.kind}' needs option '{key}'", f"add {key} = ... (see docs/rules.md#{rule.kind})"
    return None


def need_facts(rule: Rule, least: int, most: int | None = None) -> Problem | None:
    n = len(rule.facts)
    if n < least or (most is not None and n > most):
        want = f"exactly {least}" if most == least else f"at least {least}" if most is None else f"{least} to {most}"
        return "facts", f"kind '{rule.kind}' relates {want} facts, got {n}", 'list them: facts = ["a", "b"]'
    return None


def operand(rule: Rule, ref: str, option: str) -> Problem | None:
    """A ``"fact.field"`` reference must name one of the rule's facts."""
    fact, dot, fld = ref.partition(".")
    if not dot or not fld:
        return option, f"'{ref}' is not FACT.FIELD", f'write "{ref}.value" or "{ref}.key"'
    if fact not in rule.facts:
        return option, f"'{ref}' names fact '{fact}', which is not in this rule's facts", f'add "{fact}" to facts'
    return None


def facts_named(rule: Rule, option: str, names) -> Problem | None:
    """Every fact an option names must be one of the rule's facts."""
    for f in names:
        if f not in rule.facts:
            return option, f"'{f}' is not one of this rule's facts", f"use one of: {', '.join(rule.facts)}"
    return None


def split(ref: str) -> tuple[str, str]:
    fact, _, fld = ref.partition(".")
    return fact, fld


# --------------------------------------------------------------------------- values

_INT = re.compile(r"^[+-]?(0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO]?[0-7]+|\d+)[uUlL]*$")


def literal(value: Any) -> Any:
    """A captured value as a comparable literal: ints, floats, booleans, else collapsed text."""
    if isinstance(value, (bool, int, float, Count)):
        return value
    text = " ".join(str(value).split())
    if _INT.match(text):
        digits = text.rstrip("uUlL")
        try:
            return int(digits, 0)
        except ValueError:
            return int(digits.lstrip("0") or "0")
    try:
        return float(text.rstrip("fF"))
    except ValueError:
        pass
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    return text


def same(a: Any, b: Any) -> bool:
    """Equal as literals; a Count matches a number inside its range."""
    if a == b and type(a) is type(b):
        return True
    a, b = literal(a), literal(b)
    if isinstance(a, Count) and isinstance(b, Count):
        return a.lo <= b.hi and b.lo <= a.hi
    if isinstance(a, Count):
        return isinstance(b, int) and not isinstance(b, bool) and b in a
    if isinstance(b, Count):
        return isinstance(a, int) and not isinstance(a, bool) and a in b
    return a == b


def show(value: Any) -> str:
    if isinstance(value, Count):
        return str(value) if value.lo == value.hi else f"{value.lo}..{value.hi} (unconditional..total)"
    return str(value)


def by_key(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(r.key, []).append(r)
    return out


def keys_of(rule: Rule, tables) -> list[str]:
    """The keys of several by-key tables in first-seen order, less the rule's ``ignore`` globs."""
    keys: dict[str, None] = {}
    for table in tables:
        keys.update(dict.fromkeys(table))
    skip = rule.options.get("ignore", [])
    return [k for k in keys if not ignored(k, skip)]


# --------------------------------------------------------------------------- findings


def loc(row: Row, note: str = "") -> Location:
    return Location(path=row.path, line=row.line, note=note or row.fact)


def places(rows: list[Row]) -> dict[int, str]:
    """Each row's place: ``fact#n``, its position among the fact's rows with the same key.

    A place names one of several rows of a key without a line number or a path, so a finding
    that pairs two rows keeps its identity when lines move above it or its file is renamed.
    """
    seen: dict[tuple[str, str], int] = {}
    out: dict[int, str] = {}
    for r in sorted(rows, key=lambda r: (r.path, r.line)):
        n = seen.get((r.fact, r.key), 0)
        seen[(r.fact, r.key)] = n + 1
        out[id(r)] = f"{r.fact}#{n}"
    return out


def digest(parts: list[str]) -> str:
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:20]


MISSING = "missing:"  # a state listing missing places; fewer of them on head is "improved"


def finding(
    rule: Rule,
    detail: str,
    locations: list[Location],
    identity: list[str],
    state: list[str] | None = None,
    missing: list[str] | None = None,
) -> Finding:
    """A finding: its fingerprint is the rule, its kind and ``identity`` (keys, place pairs), never
    lines; its state is what is wrong (``state`` values, or the ``missing`` places)."""
    if missing is not None:  # the identity's digest first: two keys missing from the same places differ
        what = MISSING + digest([rule.id, *identity]) + ":" + "|".join(sorted(missing))
    else:
        what = digest([rule.id, *identity[:1], *(state if state is not None else identity)])
    message = f"{rule.message}: {detail}" if rule.message else detail
    seen: set[tuple[str, int]] = set()
    unique = []
    for location in locations:
        if (location.path, location.line) not in seen:
            seen.add((location.path, location.line))
            unique.append(location)
    return Finding(
        rule=rule.id,
        pillar=rule.pillar,
        severity=rule.severity,  # type: ignore[arg-type]
        message=message,
        locations=unique,
        fingerprint=digest([rule.id, rule.kind, *identity]),
        state=what,
        source=rule.source,  # type: ignore[arg-type]
        evidence=list(rule.evidence),
    )


def missing_of(state: str) -> set[str] | None:
    """The missing places a ``missing:`` state lists; None for a value state."""
    if not state.startswith(MISSING):
        return None
    places = state[len(MISSING):].partition(":")[2]
    return set(places.split("|")) if places else set()


def ignored(key: str, patterns: list[str]) -> bool:
    import fnmatch

    return any(fnmatch.fnmatchcase(key, p) for p in patterns)
