"""join-equal: rows joined on their key carry equal values.

``equal = ["dispatch.num_inputs", "register.n_inputs"]`` compares those fields of
the rows that share a key; a field may be ``key`` itself, and two operands may
come from one fact (``["register_fn.key", "register_fn.task"]`` checks that a
``register_x_task`` returns ``TASK_X``). Keys missing from some fact are not
this rule's business (a same-set rule reports them). A count (see the fact
option ``count``) equals a number that lies inside its range.

Options:
  equal   two or more ``"fact.field"`` operands (required).
  ignore  key globs never reported.
"""

from __future__ import annotations

from checks.config import Rule
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
    operand,
    same,
    show,
    split,
)

OPTIONS = {"equal": list, "ignore": list}


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS, required=("equal",))
    if problem:
        return problem
    refs = rule.options["equal"]
    if len(refs) < 2:
        return "equal", "'equal' needs at least two FACT.FIELD operands", 'write equal = ["a.value", "b.value"]'
    for ref in refs:
        problem = operand(rule, ref, "equal")
        if problem:
            return problem
    return None


def compare(rule: Rule, rows: Rows, refs: list[str], noun: str = "") -> list[Finding]:
    """Shared by join-equal and arity: one finding per key whose operands disagree."""
    indexed = {f: by_key(rows.get(f, [])) for f in {split(r)[0] for r in refs}}
    out: list[Finding] = []
    for key in keys_of(rule, indexed.values()):
        got = []
        for ref in refs:
            f, fld = split(ref)
            rs = indexed[f].get(key)
            if rs:
                value = rs[0].get(fld)
                if value is not None:
                    got.append((ref, value, rs[0]))
        if len(got) < 2:
            continue
        first_ref, first, _ = got[0]
        if all(same(first, v) for _, v, _ in got[1:]):
            continue
        parts = ", ".join(f"{ref} = {show(v)} ({row.where()})" for ref, v, row in got)
        detail = f"{noun or 'key'} '{key}' disagrees: {parts}"
        locations = [loc(row, f"{ref} = {show(v)}") for ref, v, row in got]
        out.append(finding(rule, detail, locations, [key]))
    return out


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    return compare(rule, rows, rule.options["equal"])


KIND = RuleKind("join-equal", "rows joined on a key carry equal values", validate, evaluate)
