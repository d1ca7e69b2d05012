"""gate-coverage: numeric gates in several places partition a declared range, no gap, no overlap.

Each row of the rule's facts holds a condition (``field``, default ``key``) such
as ``Q_LEN > 8`` or ``mbt >= 16 and mbt < 32`` (C ``&&``/``||``/``!`` work too).
For a fact listed in ``reject`` the condition is an early return, so that code
handles the complement. Every value of ``range`` must be handled by exactly one
row: a decode kernel that returns on ``Q_LEN > 8`` and a prefill kernel that
returns on ``Q_LEN < 16`` leave 9–15 to nobody, and that gap is the finding.

Conditions may use named constants (``if (m > kMaxDecodeLen)``): list the facts
that define them in ``constants`` (rows: key = name, ``value`` = its expression,
from ``constexpr``/``#define``/``const int``/Python module constants, in any
file). Names are resolved recursively, as in derived, before the condition is read.

Options:
  range          ``[lo, hi]``, inclusive integers (required).
  constants      facts whose rows define named constants (not gates).
  reject         facts whose conditions are early returns.
  field          the row field holding the condition; default ``key``.
  allow_overlap  do not report values handled twice; default false.
"""

from __future__ import annotations

import ast
import re

from checks.config import Rule
from checks.expr import PARSE_ERRORS, clip
from checks.facts import Row
from checks.model import Finding
from checks.rules.base import (
    Problem,
    Rows,
    RuleKind,
    check_options,
    facts_named,
    finding,
    loc,
    need_facts,
)

OPTIONS = {"range": list, "reject": list, "field": str, "allow_overlap": bool, "constants": list}

Intervals = list[tuple[int, int]]  # sorted, disjoint, inclusive


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS, required=("range",)) or need_facts(rule, 1)
    if problem:
        return problem
    rng = rule.options["range"]
    if len(rng) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in rng) or rng[0] > rng[1]:
        return "range", "'range' must be [lo, hi] with integers lo <= hi", "write range = [1, 4096]"
    return facts_named(rule, "reject", rule.options.get("reject", [])) or facts_named(
        rule, "constants", rule.options.get("constants", []))


class GateError(ValueError):
    pass


def _intersect(a: Intervals, b: Intervals) -> Intervals:
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return _merge(out)


def _merge(xs: Intervals) -> Intervals:
    out: Intervals = []
    for lo, hi in sorted(xs):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(a: Intervals, lo: int, hi: int) -> Intervals:
    out, cur = [], lo
    for x, y in a:
        if x > cur:
            out.append((cur, min(x - 1, hi)))
        cur = max(cur, y + 1)
    if cur <= hi:
        out.append((cur, hi))
    return [(x, y) for x, y in out if x <= y]


def condition_set(text: str, lo: int, hi: int) -> Intervals:
    """The integers in [lo, hi] for which a one-variable condition holds."""
    py = re.sub(r"!(?!=)", " not ", text.replace("&&", " and ").replace("||", " or "))
    py = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", py)
    try:
        node = ast.parse(py.strip(), mode="eval").body
        return _eval(node, lo, hi, text)
    except GateError:
        raise
    except PARSE_ERRORS:
        raise GateError(f"cannot read condition '{clip(text)}'") from None


def _num(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _num(node.operand)
        return -v if v is not None else None
    return None


def _cmp(op: ast.cmpop, n: int, lo: int, hi: int, flipped: bool) -> Intervals:
    if flipped:  # n OP x  ==  x OP' n
        op = {ast.Lt: ast.Gt(), ast.LtE: ast.GtE(), ast.Gt: ast.Lt(), ast.GtE: ast.LtE()}.get(type(op), op)
    kind = type(op)
    if kind is ast.Lt:
        r = [(lo, n - 1)]
    elif kind is ast.LtE:
        r = [(lo, n)]
    elif kind is ast.Gt:
        r = [(n + 1, hi)]
    elif kind is ast.GtE:
        r = [(n, hi)]
    elif kind is ast.Eq:
        r = [(n, n)]
    elif kind is ast.NotEq:
        r = [(lo, n - 1), (n + 1, hi)]
    else:
        raise GateError("unsupported comparison")
    return _intersect(_merge([(max(a, lo), min(b, hi)) for a, b in r if a <= b]), [(lo, hi)])


def _eval(node: ast.expr, lo: int, hi: int, text: str) -> Intervals:
    if isinstance(node, ast.BoolOp):
        parts = [_eval(v, lo, hi, text) for v in node.values]
        if isinstance(node.op, ast.And):
            acc = [(lo, hi)]
            for p in parts:
                acc = _intersect(acc, p)
            return acc
        return _merge([iv for p in parts for iv in p])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _complement(_eval(node.operand, lo, hi, text), lo, hi)
    if isinstance(node, ast.Compare):
        acc = [(lo, hi)]
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            ln, rn = _num(left), _num(right)
            if ln is None and rn is not None:
                acc = _intersect(acc, _cmp(op, rn, lo, hi, flipped=False))
            elif rn is None and ln is not None:
                acc = _intersect(acc, _cmp(op, ln, lo, hi, flipped=True))
            else:
                raise GateError(f"condition '{clip(text)}' must compare one variable with a number")
            left = right
        return acc
    raise GateError(f"condition '{clip(text)}' is not a comparison")


def _fmt(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}–{b}"


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    fld = rule.options.get("field", "key")
    consts = rule.options.get("constants", [])
    return [("field", f, fld) for f in rule.facts if f not in consts] + [("constants", f, "value") for f in consts]


_NAME = re.compile(r"\b[A-Za-z_][A-Za-z_0-9]*(?:::[A-Za-z_][A-Za-z_0-9]*)*\b")


def _resolve(text: str, env) -> str:
    """Replace each defined constant in a condition by its value."""
    from checks.rules.derived import EvalError

    def value(m: re.Match) -> str:
        name = m.group(0).split("::")[-1]
        if name in ("and", "or", "not") or name not in env.rows:
            return m.group(0)
        try:
            return str(env.get(name))
        except EvalError:
            return m.group(0)
    return _NAME.sub(value, text)


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    lo, hi = rule.options["range"]
    fld = rule.options.get("field", "key")
    reject = set(rule.options.get("reject", []))
    consts = rule.options.get("constants", [])
    env = None
    if consts:
        from checks.rules.derived import _Env

        env = _Env([r for f in consts for r in rows.get(f, [])], "value")
    handled: list[tuple[Row, Intervals]] = []
    out: list[Finding] = []
    for f in rule.facts:
        if f in consts:
            continue
        for r in rows.get(f, []):
            text = str(r.get(fld))
            if env is not None:
                text = _resolve(text, env)
            try:
                s = condition_set(text, lo, hi)
            except GateError as exc:
                out.append(finding(rule, str(exc), [loc(r)], ["unreadable", text]))
                continue
            handled.append((r, _complement(s, lo, hi) if f in reject else s))
    # Sweep: boundaries where coverage may change.
    cuts = sorted({lo, hi + 1, *(x for _, s in handled for a, b in s for x in (a, b + 1))})
    gaps: Intervals = []
    overlaps: list[tuple[int, int, list[Row]]] = []
    for a, nxt in zip(cuts, cuts[1:]):
        b = nxt - 1
        if a > hi:
            break
        who = [r for r, s in handled if any(x <= a and b <= y for x, y in s)]
        if not who:
            gaps.append((a, b))
        elif len(who) > 1:
            overlaps.append((a, b, who))
    everyone = [loc(r, f"{r.fact}: {r.get(fld)}") for r, _ in handled]
    for a, b in _merge(gaps):
        out.append(finding(rule, f"values {_fmt(a, b)} of [{lo}, {hi}] are handled by no gate", everyone, ["gap", _fmt(a, b)]))
    if not rule.options.get("allow_overlap", False):
        merged: list[tuple[int, int, list[Row]]] = []
        for a, b, who in overlaps:
            if merged and merged[-1][1] + 1 == a and merged[-1][2] == who:
                merged[-1] = (merged[-1][0], b, who)
            else:
                merged.append((a, b, who))
        for a, b, who in merged:
            names = ", ".join(f"{r.get(fld)} ({r.where()})" for r in who)
            detail = f"values {_fmt(a, b)} are handled by more than one gate: {names}"
            out.append(finding(rule, detail, [loc(r) for r in who], ["overlap", _fmt(a, b)]))
    return out


KIND = RuleKind("gate-coverage", "numeric gates partition a range with no gap and no overlap", validate, evaluate, refs)
