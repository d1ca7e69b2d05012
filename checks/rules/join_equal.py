"""join-equal: rows joined on their key carry equal values.

``equal = ["dispatch.num_inputs", "register.n_inputs"]`` compares those fields of
the rows that share a key; a field may be ``key`` itself, and two operands may
come from one fact (``["register_fn.key", "register_fn.task"]`` checks that a
``register_x_task`` returns ``TASK_X``). An operand may be arithmetic over one
fact's fields: ``"dispatch.num_inputs + dispatch.num_outputs"``. Keys missing
from some fact are not this rule's business (a same-set rule reports them). A
count (see the fact option ``count``) equals a number that lies inside its range.

Every row is compared: operands of one fact are compared within each row, and
each row of one fact with each row of every other fact that carries the same
key. Each disagreeing pair is its own finding, located at both rows.

Options:
  equal   two or more ``"fact.field"`` operands (required).
  ignore  key globs never reported.
"""

from __future__ import annotations

from typing import Any

from checks.config import Rule
from checks.expr import Operand, OperandError, parse_operand
from checks.facts import Row
from checks.model import Finding
from checks.rules.base import (
    Problem,
    Rows,
    RuleKind,
    by_key,
    check_options,
    finding,
    keys_of,
    loc,
    places,
    same,
    show,
)

OPTIONS = {"equal": list, "ignore": list}


def operand_problem(rule: Rule, ref: str, option: str) -> Problem | None:
    """An operand must read and name one of the rule's facts."""
    try:
        op = parse_operand(ref)
    except OperandError as exc:
        return option, str(exc), f'write "{ref.split(".")[0]}.value", or arithmetic like "a.x + a.y"'
    if op.fact not in rule.facts:
        return option, f"'{ref}' names fact '{op.fact}', which is not in this rule's facts", f'add "{op.fact}" to facts'
    return None


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS, required=("equal",))
    if problem:
        return problem
    refs = rule.options["equal"]
    if len(refs) < 2:
        return "equal", "'equal' needs at least two FACT.FIELD operands", 'write equal = ["a.value", "b.value"]'
    for ref in refs:
        problem = operand_problem(rule, ref, "equal")
        if problem:
            return problem
    return None


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    """(option, fact, field) of every field the rule reads, for the config's field check."""
    return [("equal", op.fact, fld) for ref in rule.options.get("equal", []) for op in [parse_operand(ref)]
            for fld in op.fields]


def compare(rule: Rule, rows: Rows, texts: list[str], noun: str = "") -> list[Finding]:
    """Shared by join-equal and arity: one finding per disagreeing row (one fact) or row pair (two facts)."""
    ops = [parse_operand(t) for t in texts]
    facts = list(dict.fromkeys(op.fact for op in ops))
    indexed = {f: by_key(rows.get(f, [])) for f in facts}
    place = places([r for f in facts for r in rows.get(f, [])])
    out: list[Finding] = []
    for key in keys_of(rule, indexed.values()):
        present = [f for f in facts if indexed[f].get(key)]
        # Operands of one fact, on each row of it.
        for f in present:
            mine = [op for op in ops if op.fact == f]
            if len(mine) < 2:
                continue
            for row in indexed[f][key]:
                got = _values(mine, row)
                if len(got) >= 2 and not _agree(got):
                    out.append(_finding(rule, key, noun, got, [place[id(row)]]))
        # Each row of one fact against each row of every later fact, by value groups: rows with one value
        # compare once, so a key with many agreeing rows costs little; every disagreeing row is reported.
        for i, f in enumerate(present):
            fa = _groups([o for o in ops if o.fact == f], indexed[f][key])
            for g in present[i + 1:]:
                gb = _groups([o for o in ops if o.fact == g], indexed[g][key])
                for (gref, gval), rbs in gb.items():
                    bad = [(fref, fval, ras) for (fref, fval), ras in fa.items() if not same(fval, gval)]
                    for fref, fval, ras in bad:
                        for rb in rbs:
                            got = [(fref, fval, r) for r in ras] + [(gref, gval, rb)]
                            out.append(_finding(rule, key, noun, got, [place[id(ras[0])], place[id(rb)]]))
    return out


def _groups(ops: list[Operand], rows: list[Row]) -> dict[tuple[str, Any], list[Row]]:
    """Rows by (operand, value) of their first operand that has a value, in first-seen order."""
    out: dict[tuple[str, Any], list[Row]] = {}
    for row in rows:
        got = _values(ops, row)[:1]
        if got:
            ref, value, _ = got[0]
            out.setdefault((ref, _hashable(value)), []).append(row)
    return out


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return str(value)


def _values(ops: list[Operand], row: Row) -> list[tuple[str, object, Row]]:
    out = []
    for op in ops:
        v = op.value(row)
        if v is not None:
            out.append((op.text, v, row))
    return out


def _agree(got: list[tuple[str, object, Row]]) -> bool:
    first = got[0][1]
    return all(same(first, v) for _, v, _ in got[1:])


def _finding(rule: Rule, key: str, noun: str, got: list[tuple[str, object, Row]], where: list[str]) -> Finding:
    shown = got if len(got) <= 4 else [*got[:2], *got[-1:]]
    parts = ", ".join(f"{ref} = {show(v)} ({row.where()})" for ref, v, row in shown)
    if len(shown) < len(got):
        parts += f" (and {len(got) - len(shown)} more rows with {got[0][0]} = {show(got[0][1])})"
    detail = f"{noun or 'key'} '{key}' disagrees: {parts}"
    locations = [loc(row, f"{ref} = {show(v)}") for ref, v, row in got]
    return finding(rule, detail, locations, [key, *where], state=sorted({show(v) for _, v, _ in got}))


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    return compare(rule, rows, rule.options["equal"])


KIND = RuleKind("join-equal", "rows joined on a key carry equal values", validate, evaluate, refs)
