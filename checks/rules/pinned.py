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
    by_key,
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


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    fld = rule.options.get("field", "value")
    return [("field", f, fld) for f in rule.facts]


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    fld = rule.options.get("field", "value")
    all_rows = [r for f in rule.facts for r in rows.get(f, [])]
    pins = rule.options.get("values")
    out: list[Finding] = []
    table = by_key(all_rows)
    if pins is None:
        want = rule.options["value"]
        targets = [(k, want, rs) for k, rs in table.items()]
    else:
        targets = [(k, v, table.get(k, [])) for k, v in pins.items()]
    for key, want, hits in targets:
        if not hits:
            out.append(finding(rule, f"'{key}' is pinned to {want} but no longer found", [], [key, "missing"]))
        wrong = [(r, r.get(fld)) for r in hits if r.get(fld) is not None and not same(r.get(fld), want)]
        if wrong:
            got = sorted({str(literal(v)) for _, v in wrong})
            # One finding per key: the same wrong value in two places is one drift, located at both.
            out.append(finding(rule, f"'{key}' is {', '.join(got)}, pinned to {want}", [loc(r) for r, _ in wrong],
                               [key], state=got))
    return out


KIND = RuleKind("pinned", "a value stays as declared", validate, evaluate, refs)
