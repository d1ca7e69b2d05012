"""arity: a number declared in one place matches how many times something is done in another.

The typical case is a dispatch table's ``num_inputs`` against the ``new_input(...)``
calls in the Python wrapper that registers the same task. The counting fact
(option ``count`` on the fact) yields a range (unconditional, total) because
calls can sit in branches; only a declared number outside that range is flagged.

Options:
  count     ``"fact.field"`` holding the counted range (the field is ``count``).
  declared  one or more ``"fact.field"`` holding the declared number, or arithmetic over
            one fact's fields (``"dispatch.num_inputs + dispatch.num_outputs"``).

Every row is compared, as in join-equal: each declared row against each counted row of its key.
  ignore    key globs never reported.
"""

from __future__ import annotations

from checks.config import Rule
from checks.model import Finding
from checks.rules.base import Problem, Rows, RuleKind, check_options
from checks.rules.join_equal import compare, operand_problem

OPTIONS = {"count": str, "declared": (list, str), "ignore": list}


def _declared(rule: Rule) -> list[str]:
    d = rule.options.get("declared", [])
    return [d] if isinstance(d, str) else list(d)


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS, required=("count", "declared"))
    if problem:
        return problem
    for ref in [rule.options["count"], *_declared(rule)]:
        problem = operand_problem(rule, ref, "count" if ref == rule.options["count"] else "declared")
        if problem:
            return problem
    if not _declared(rule):
        return "declared", "'declared' is empty", 'write declared = ["table.num_inputs"]'
    return None


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    from checks.expr import parse_operand

    out = []
    for option, ref in [("count", rule.options.get("count", "")), *(("declared", d) for d in _declared(rule))]:
        op = parse_operand(ref)
        out += [(option, op.fact, fld) for fld in op.fields]
    return out


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    out: list[Finding] = []
    for ref in _declared(rule):
        out += compare(rule, rows, [ref, rule.options["count"]], noun="count of")
    return out


KIND = RuleKind("arity", "a declared number matches a counted number of calls", validate, evaluate, refs)
