"""consistent: all rows sharing a key agree on a field (every launch writing one buffer uses the same grid).

Where join-equal relates two facts, this relates the rows of one key among
themselves, in one fact or several: every registration of one op name uses the
same schema. Values compare as literals (``0x10`` equals ``16``, spacing is
collapsed). One finding per key that has more than one value, located at every
row of the values that are not the most common one (and one row of it).

Options:
  field   the row field that must agree; default ``value``.
  ignore  key globs never reported.
"""

from __future__ import annotations

from checks.config import Rule
from checks.facts import Row
from checks.model import Finding
from checks.rules.base import Problem, Rows, RuleKind, by_key, check_options, finding, keys_of, literal, loc, need_facts

OPTIONS = {"field": str, "ignore": list}


def validate(rule: Rule) -> Problem | None:
    return check_options(rule, OPTIONS) or need_facts(rule, 1)


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    fld = rule.options.get("field", "value")
    return [("field", f, fld) for f in rule.facts]


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    fld = rule.options.get("field", "value")
    table = by_key([r for f in rule.facts for r in rows.get(f, [])])
    out: list[Finding] = []
    for key in keys_of(rule, [table]):
        groups: dict[str, list[Row]] = {}
        for r in table[key]:
            v = r.get(fld)
            if v is not None:
                groups.setdefault(str(literal(v)), []).append(r)
        if len(groups) < 2:
            continue
        ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        common, others = ranked[0], ranked[1:]
        shown = "; ".join(f"{v} at {', '.join(r.where() for r in rs)}" for v, rs in ranked)
        detail = f"rows of '{key}' disagree on {fld}: {shown}"
        locations = [loc(common[1][0], f"{fld} = {common[0]} (most rows)")]
        locations += [loc(r, f"{fld} = {v}") for v, rs in others for r in rs]
        out.append(finding(rule, detail, locations, [key], state=sorted(groups)))
    return out


KIND = RuleKind("consistent", "all rows sharing a key agree on a field", validate, evaluate, refs)
