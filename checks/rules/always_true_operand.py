"""always-true-operand: a bare operand in an ``||`` chain of comparisons makes it always true.

In ``task_type == TASK_A || task_type == TASK_B || (TASK_C)`` the last operand is
an enum constant, non-zero, so every task takes that branch. The rule reads the
tree-sitter node of each row's ``field`` capture (default ``key``), flattens its
``||``/``or`` chain, and reports bare operands when at least one sibling is a
comparison. By default only constants count as bare: literals and names whose
last part is in CONSTANT_CASE (``TASK_C``, ``TaskType::TASK_C``, ``Kind.B``), so
a boolean such as ``verbose`` in ``mode == A || verbose`` is left alone.

Options:
  field  the capture holding the condition node; default ``key``.
  bare   ``"constants"`` (default) or ``"any"`` (every bare name or literal).
"""

from __future__ import annotations

import re

from checks import syntax
from checks.config import Rule
from checks.model import Finding, Location
from checks.rules.base import (
    Problem,
    Rows,
    RuleKind,
    check_options,
    finding,
    need_facts,
)

OPTIONS = {"field": str, "bare": str}
_CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")
_LITERALS = {"number_literal", "integer", "true", "string_literal", "string", "char_literal"}

_BARE = {
    "identifier", "qualified_identifier", "field_expression", "attribute", "number_literal", "integer",
    "true", "string_literal", "string", "scoped_identifier", "char_literal",
}
_COMPARISON = {"==", "!=", "<", ">", "<=", ">=", "is", "in"}


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS) or need_facts(rule, 1)
    if problem is None and rule.options.get("bare", "constants") not in ("constants", "any"):
        return "bare", "'bare' must be \"constants\" or \"any\"", 'write bare = "constants"'
    return problem


def _is_bare(node, any_name: bool) -> bool:
    if node.type not in _BARE:
        return False
    if any_name or node.type in _LITERALS:
        return True
    last = re.split(r"::|\.|->", syntax.text(node))[-1].strip()
    return bool(_CONSTANT.match(last))


def _strip(node):
    while node is not None and node.type in ("parenthesized_expression", "condition_clause") and node.named_child_count == 1:
        node = node.named_children[0]
    return node


def _operator(node) -> str | None:
    op = node.child_by_field_name("operator")
    if op is not None:
        return op.type
    if node.type == "comparison_operator":
        return "=="
    return None


def _chain(node) -> list:
    node = _strip(node)
    if node.type in ("binary_expression", "boolean_operator") and _operator(node) in ("||", "or"):
        return _chain(node.child_by_field_name("left")) + _chain(node.child_by_field_name("right"))
    return [node]


def _is_comparison(node) -> bool:
    return node.type == "comparison_operator" or (node.type == "binary_expression" and _operator(node) in _COMPARISON)


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    fld = rule.options.get("field", "key")
    return [("field", f, fld) for f in rule.facts]


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    fld = rule.options.get("field", "key")
    any_name = rule.options.get("bare", "constants") == "any"
    out: list[Finding] = []
    seen: dict[tuple[str, str], int] = {}  # the identity survives edits elsewhere in the chain
    for f in rule.facts:
        for r in rows.get(f, []):
            node = r.nodes.get(fld)
            if node is None:
                continue
            ops = _chain(node)
            if len(ops) < 2 or not any(_is_comparison(o) for o in ops):
                continue
            first = next(o for o in ops if _is_comparison(o))
            lhs = first.child_by_field_name("left") or first.named_children[0]
            subject = syntax.text(lhs)
            for o in ops:
                if _is_bare(o, any_name):
                    bare = syntax.text(o)
                    cond = " ".join(syntax.text(node).split())
                    line = o.start_point[0] + 1
                    detail = f"'{bare}' is a bare operand in '{cond}', so the condition is always true; write {subject} == {bare}"
                    n = seen[(subject, bare)] = seen.get((subject, bare), 0) + 1
                    out.append(finding(rule, detail, [Location(r.path, line, note=r.fact)], [subject, bare, str(n)]))
    return out


KIND = RuleKind("always-true-operand", "a bare operand in an || chain of comparisons", validate, evaluate, refs, nodes=True)
