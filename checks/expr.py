"""Rule operands: ``"fact.field"`` or arithmetic over one fact's fields, e.g. ``"dispatch.num_inputs + dispatch.num_outputs"``.

An operand is evaluated on one row, so every field it names must come from the
same fact. Counts (ranges from the fact option ``count``) add and scale as
ranges, so ``wrapper.count + 1`` still matches any number inside the range.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

from checks.facts import Count, Row


class OperandError(ValueError):
    """The operand cannot be read; the message says how to write it."""


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
_ALLOWED = (ast.Attribute, ast.Name, ast.BinOp, ast.Constant, ast.UnaryOp, ast.Load, ast.USub, *_OPS)


@dataclass(frozen=True)
class Operand:
    text: str
    fact: str
    fields: tuple[str, ...]
    node: ast.expr

    @property
    def simple(self) -> bool:
        return isinstance(self.node, ast.Attribute)

    def value(self, row: Row) -> Any:
        """The operand on ``row``; None when a field it needs is absent or not a number."""
        from checks.rules.base import literal

        if self.simple:
            return row.get(self.fields[0])
        try:
            return _eval(self.node, row, literal)
        except (TypeError, ZeroDivisionError, ValueError, RecursionError):
            return None


#: what ``ast.parse`` raises on text a head controls: a null byte (ValueError), nesting past the parser's depth
PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError)


def clip(text: str, limit: int = 200) -> str:
    """Text a head controls, as a finding quotes it: at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit] + "…"


def parse_operand(text: str) -> Operand:
    """Read ``text``; raise OperandError naming the fix."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except PARSE_ERRORS:
        raise OperandError(f"'{clip(text)}' is not FACT.FIELD or an arithmetic expression over them") from None
    refs: list[tuple[str, str]] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            if not isinstance(n.value, ast.Name):
                raise OperandError(f"'{text}': write fields as FACT.FIELD")
            refs.append((n.value.id, n.attr))
        elif isinstance(n, ast.Name) and not any(isinstance(p, ast.Attribute) and p.value is n for p in ast.walk(node)):
            raise OperandError(f"'{text}' is not FACT.FIELD")
        elif isinstance(n, ast.BinOp) and type(n.op) not in _OPS:
            raise OperandError(f"'{text}': only + - * // are allowed in an operand")
        elif isinstance(n, ast.Constant) and (not isinstance(n.value, int) or isinstance(n.value, bool)):
            raise OperandError(f"'{text}': only integer constants are allowed in an operand")
        elif not isinstance(n, _ALLOWED):
            raise OperandError(f"'{text}' is not FACT.FIELD or an arithmetic expression over them")
    if not refs:
        raise OperandError(f"'{text}' names no FACT.FIELD")
    facts = {f for f, _ in refs}
    if len(facts) > 1:
        raise OperandError(f"'{text}' mixes facts {', '.join(sorted(facts))}; one operand reads one row")
    return Operand(text, refs[0][0], tuple(dict.fromkeys(f for _, f in refs)), node)


def _eval(node: ast.expr, row: Row, literal) -> Any:
    if isinstance(node, ast.Attribute):
        v = literal(row.get(node.attr))
        if v is None or isinstance(v, bool) or not isinstance(v, (int, Count)):
            raise TypeError(node.attr)
        return v
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _scale(_eval(node.operand, row, literal), -1)
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, row, literal), _eval(node.right, row, literal)
        op = _OPS[type(node.op)]
        if isinstance(a, Count) or isinstance(b, Count):
            return _range(op, a, b)
        return op(a, b)
    raise TypeError(ast.dump(node))


def _scale(v: Any, k: int) -> Any:
    if isinstance(v, Count):
        lo, hi = sorted((v.lo * k, v.hi * k))
        return Count(lo, hi)
    return v * k


def _range(op, a: Any, b: Any) -> Count:
    a = a if isinstance(a, Count) else Count(a, a)
    b = b if isinstance(b, Count) else Count(b, b)
    ends = [op(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Count(min(ends), max(ends))
