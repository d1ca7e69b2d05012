"""table-equal: two dict or list literals agree key by key (e.g. two TP shard-rule tables).

Each fact yields one row per table entry (key, and the entry's value in ``field``);
for list literals use the fact option ``key = "@index"``. Every key that is only
in one table, or whose values differ, is its own finding. A key with several rows (a table
written twice, an entry repeated) compares every row of one table with every row of the other.

Options:
  field   the row field holding the entry's value; default ``value``.
  ignore  key globs never reported.
"""

from __future__ import annotations

import re

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
    need_facts,
    places,
    same,
)

OPTIONS = {"field": str, "ignore": list}


def validate(rule: Rule) -> Problem | None:
    return check_options(rule, OPTIONS) or need_facts(rule, 2, 2)


def _norm(value: object) -> object:
    """Tables written by hand differ in quotes and spacing; compare what they mean."""
    if not isinstance(value, str):
        return value
    parts = re.split(r"(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')", value)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a string literal: same text whichever quotes
            out.append('"' + part[1:-1] + '"')
        else:  # code: spacing and trailing commas carry no meaning
            out.append(re.sub(r",([)\]}])", r"\1", re.sub(r"\s+", "", part)))
    return "".join(out)


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    fld = rule.options.get("field", "value")
    return [("field", f, fld) for f in rule.facts]


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    fld = rule.options.get("field", "value")
    a_id, b_id = rule.facts
    a, b = by_key(rows.get(a_id, [])), by_key(rows.get(b_id, []))
    place = places(rows.get(a_id, []) + rows.get(b_id, []))
    out: list[Finding] = []
    for key in keys_of(rule, (a, b)):
        ras, rbs = a.get(key, []), b.get(key, [])
        if not ras or not rbs:
            have, lack = (ras or rbs), (b_id if not rbs else a_id)
            detail = f"'{key}' is in {have[0].fact} but not in {lack}"
            out.append(finding(rule, detail, [loc(r) for r in have], [key, "only", have[0].fact]))
            continue
        for ra in ras:
            for rb in rbs:
                va, vb = ra.get(fld), rb.get(fld)
                if not same(_norm(va), _norm(vb)):
                    detail = f"'{key}' differs: {a_id} has {va} ({ra.where()}), {b_id} has {vb} ({rb.where()})"
                    out.append(finding(rule, detail, [loc(ra, f"{a_id}: {va}"), loc(rb, f"{b_id}: {vb}")],
                                       [key, "differs", place[id(ra)], place[id(rb)]], state=[str(_norm(va)), str(_norm(vb))]))
    return out


KIND = RuleKind("table-equal", "two dict or list literals agree key by key", validate, evaluate, refs)
