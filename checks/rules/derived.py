"""derived: an arithmetic relation over constants defined across files must hold.

``expr = "TOKEN_BYTES == NOPE_DIM + ROPE_DIM*2 + SCALE_DIM == 584"``. The rule's facts
yield constants (row key = name, ``field`` = its defining expression); a constant
may be computed from others, in other files and languages, and is resolved
recursively. Integer ``/`` divides like C when both sides are integers.

Aggregates read a whole fact: ``max(workers.value)``, ``min(...)``, ``sum(...)``
over a field of every row, ``count(workers)`` its number of rows, e.g.
``expr = "MAX_WORKERS >= max(worker_table.n)"``.

Options:
  expr   the relation (Python syntax: + - * / // % ** << >> & | and comparisons).
  field  the row field holding each constant's expression; default ``value``.
"""

from __future__ import annotations

import ast
import operator
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
    finding,
    loc,
    need_facts,
)

OPTIONS = {"expr": str, "field": str}

_BIN = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
}
_CMP = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_SUFFIX = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b")
_CAST = re.compile(r"\b(?:static_cast|int|size_t|int64_t|int32_t)\s*<[^<>]*>\s*")


class EvalError(ValueError):
    pass


def _to_python(text: str) -> str:
    text = _CAST.sub("", _SUFFIX.sub(r"\1", text.strip().rstrip(";")))
    return text.replace("&&", " and ").replace("||", " or ")


def _parse(text: str) -> ast.expr:
    try:
        return ast.parse(_to_python(text), mode="eval").body
    except PARSE_ERRORS:
        raise EvalError(f"cannot read expression '{clip(text)}'") from None


AGGREGATES = ("max", "min", "sum", "count")


def _aggregate_args(tree: ast.expr) -> set[int]:
    """ids of the nodes that are aggregate arguments (fact names, fact.field), not constants."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in AGGREGATES:
            for a in n.args:
                if isinstance(a, ast.Attribute) or (n.func.id == "count" and isinstance(a, ast.Name)):
                    out.update(id(x) for x in ast.walk(a))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            out.add(id(n.func))
    return out


def names_in(text: str) -> list[str]:
    tree = _parse(text)
    skip = _aggregate_args(tree)
    return [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in skip]


def aggregates_in(text: str) -> list[tuple[str, str, str | None]]:
    """(function, fact, field or None) of each aggregate in ``text``."""
    out: list[tuple[str, str, str | None]] = []
    for n in ast.walk(_parse(text)):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in AGGREGATES and len(n.args) == 1:
            a = n.args[0]
            if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name):
                out.append((n.func.id, a.value.id, a.attr))
            elif n.func.id == "count" and isinstance(a, ast.Name):
                out.append(("count", a.id, None))
    return out


def validate(rule: Rule) -> Problem | None:
    problem = check_options(rule, OPTIONS, required=("expr",)) or need_facts(rule, 1)
    if problem:
        return problem
    try:
        names_in(rule.options["expr"])
        aggs = aggregates_in(rule.options["expr"])
    except EvalError as exc:
        return "expr", str(exc), "write a Python expression such as A == B + C * 2"
    for fn, fact, _ in aggs:
        if fact not in rule.facts:
            return "expr", f"{fn}({fact}...) names fact '{fact}', which is not in this rule's facts", f'add "{fact}" to facts'
    return None


def refs(rule: Rule) -> list[tuple[str, str, str]]:
    fld = rule.options.get("field", "value")
    aggs = aggregates_in(rule.options.get("expr", ""))
    only = {f for _, f, _ in aggs}
    out: list[tuple[str, str, str]] = [("expr", f, x) for _, f, x in aggs if x is not None]
    # Facts read only through aggregates need not hold constants.
    return out + [("field", f, fld) for f in rule.facts if f not in only]


MAX_CHAIN = 200  # constants defined through constants: far past any real header, well inside Python's stack


class _Env:
    """Constants by name, resolved on demand, with cycle detection."""

    def __init__(self, rows: list[Row], fld: str, by_fact: Rows | None = None):
        self.by_fact = by_fact or {}
        self.rows: dict[str, Row] = {}
        for r in rows:
            self.rows.setdefault(r.key, r)
        self.fld = fld
        self.values: dict[str, int | float] = {}
        self.active: set[str] = set()

    def get(self, name: str) -> int | float:
        if name in self.values:
            return self.values[name]
        row = self.rows.get(name)
        if row is None:
            raise EvalError(f"'{name}' is not defined by any of the rule's facts")
        if name in self.active:
            raise EvalError(f"'{name}' is defined in terms of itself")
        if len(self.active) >= MAX_CHAIN:
            raise EvalError(f"'{name}' is defined through more than {MAX_CHAIN} other constants; nested too deeply")
        self.active.add(name)
        try:
            value = self.eval(_parse(str(row.get(self.fld))))
        except RecursionError:  # a value the head nests (or chains through names) deeper than Python recurses
            raise EvalError(f"'{name}' is nested too deeply to evaluate") from None
        finally:
            self.active.discard(name)
        self.values[name] = value
        return value

    def eval(self, node: ast.expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            return self.get(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.eval(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = self.eval(node.left), self.eval(node.right)
            if isinstance(node.op, ast.Div):
                if isinstance(a, int) and isinstance(b, int):
                    return int(a / b) if b else _zero()
                return a / b if b else _zero()
            if type(node.op) in _BIN:
                if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
                    _zero()
                return _BIN[type(node.op)](a, b)
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.eval(right_node)
                if type(op) not in _CMP or not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BoolOp):
            vals = [self.eval(v) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in AGGREGATES
                and len(node.args) == 1 and isinstance(node.args[0], (ast.Attribute, ast.Name))
                and (isinstance(node.args[0], ast.Name) and node.args[0].id in self.by_fact
                     or isinstance(node.args[0], ast.Attribute) and isinstance(node.args[0].value, ast.Name)
                     and node.args[0].value.id in self.by_fact)):
            return self.aggregate(node.func.id, node.args[0])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            args = [self.eval(a) for a in node.args]
            return min(args) if node.func.id == "min" else max(args)
        raise EvalError(f"unsupported expression '{ast.unparse(node)}'")


    def aggregate(self, fn: str, arg: ast.expr):
        if isinstance(arg, ast.Name):
            if fn != "count":
                raise EvalError(f"{fn}({arg.id}) needs a field: {fn}({arg.id}.value)")
            return len(self.by_fact[arg.id])
        assert isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)
        rows = self.by_fact[arg.value.id]
        if fn == "count":
            return sum(1 for r in rows if r.get(arg.attr) is not None)
        vals = []
        for r in rows:
            v = r.get(arg.attr)
            if v is None:
                continue
            vals.append(self.eval(_parse(str(v))))
        if not vals:
            raise EvalError(f"{fn}({arg.value.id}.{arg.attr}) has no rows")
        return max(vals) if fn == "max" else min(vals) if fn == "min" else sum(vals)


def _zero():
    raise EvalError("division by zero")


def evaluate(rule: Rule, rows: Rows) -> list[Finding]:
    expr = rule.options["expr"]
    fld = rule.options.get("field", "value")
    env = _Env([r for f in rule.facts for r in rows.get(f, [])], fld, rows)
    tree = _parse(expr)
    used = list(dict.fromkeys(names_in(expr)))
    try:
        ok = env.eval(tree)
    except EvalError as exc:
        locations = [loc(env.rows[n], f"{n} = {env.rows[n].get(fld)}") for n in used if n in env.rows]
        return [finding(rule, f"cannot evaluate {expr}: {exc}", locations, [expr, "error"])]
    if ok:
        return []
    shown = ", ".join(f"{n} = {env.values.get(n, '?')}" for n in used)
    locations = [loc(env.rows[n], _note(n, env.rows[n].get(fld), env.values.get(n))) for n in used if n in env.rows]
    parts = _sides(tree, env)
    detail = f"{expr} does not hold: {parts} (with {shown})"
    return [finding(rule, detail, locations, [expr], state=[shown])]


def _note(name: str, text: object, value: object) -> str:
    return f"{name} = {text}" if str(text).strip() == str(value) else f"{name} = {text} = {value}"


def _sides(tree: ast.expr, env: _Env) -> str:
    if isinstance(tree, ast.Compare):
        sides = [tree.left, *tree.comparators]
        ops = [{ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}[type(o)] for o in tree.ops]
        out = str(env.eval(sides[0]))
        for op, side in zip(ops, sides[1:]):
            out += f" {op} {env.eval(side)}"
        return out
    return "false"


KIND = RuleKind("derived", "an arithmetic relation over constants holds", validate, evaluate, refs)
