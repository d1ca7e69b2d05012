"""The rule kinds, one module each, in one registry (the config accepts exactly these kinds)."""

from __future__ import annotations

from checks.rules import (
    always_true_operand,
    arity,
    consistent,
    derived,
    gate_coverage,
    join_equal,
    pinned,
    same_set,
    table_equal,
)
from checks.rules.base import RuleKind

REGISTRY: dict[str, RuleKind] = {
    m.KIND.name: m.KIND
    for m in (same_set, join_equal, arity, pinned, derived, table_equal, gate_coverage, always_true_operand, consistent)
}

__all__ = ["REGISTRY", "RuleKind"]
