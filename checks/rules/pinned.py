"""pinned: a value must stay as declared, e.g. ``use_mtp_prefill_attention = True``.

Options:
  value   the value every row of the facts must carry (string, number or boolean).
  values  ``{KEY = value}``: per-key values; a pinned key that no row carries is a finding.
  field   which row field holds the value; default ``value``.
"""

from __future__ import annotations

from checks.config import Rule
from checks.model import Finding
from checks.rules.base import (
    Problem,
    Rows,
    RuleKind,
    check_options,
    finding,
    literal,
    loc,
    need_facts,
    same,
)

OPTIONS = {"value": (str, int, float, bool), "values": dict, "field": str}


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS) or need_facts(rule, 1)
    if problem:
        return problem
    if ("value" in rule.options) == ("values" in rule.options):
        return None, "kind 'pinned' needs exactly one of 'value' or 'values'", 'add value = "..." or values = { KEY = "..." }'
    return None


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    fld = rule.options.get("field", "value")
    all_rows = [r for f in rule.facts for r in rows.get(f, [])]
    pins = rule.options.get("values")
    out: list[Finding] = []
    if pins is None:
        want = rule.options["value"]
        for r in all_rows:
            got = r.get(fld)
            if got is not None and not same(got, want):
                out.append(finding(rule, f"'{r.key}' is {got}, pinned to {want}", [loc(r)], [r.key, str(literal(got))]))
        return out
    for key, want in pins.items():
        hits = [r for r in all_rows if r.key == key]
        if not hits:
            out.append(finding(rule, f"'{key}' is pinned to {want} but no longer found", [], [key, "missing"]))
        for r in hits:
            got = r.get(fld)
            if got is not None and not same(got, want):
                out.append(finding(rule, f"'{key}' is {got}, pinned to {want}", [loc(r)], [key, str(literal(got))]))
    return out


KIND = RuleKind("pinned", "a value stays as declared", validate, evaluate)
