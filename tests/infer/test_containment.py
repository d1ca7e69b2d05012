"""Containment by name set (near-linear) gives what every pair of families (quadratic) gives."""

from __future__ import annotations

from collections import defaultdict

from checks.infer.families import FileMembers
from checks.infer.mine import (
    Containment,
    Family,
    Relation,
    _canonical,
    _sentinel,
    build_families,
    mine,
    related_in_one_file,
)


def _pairs(families: list[Family], min_support: int, min_ratio: float) -> dict[int, set[int]]:
    """The reference: every pair of families tested, as inference did before name sets."""
    out: dict[int, set[int]] = {}
    for a, fa in enumerate(families):
        real = {n for n in fa.names if not _sentinel(fa, n)}
        if len(real) < min_support:
            continue
        found = set()
        for b, fb in enumerate(families):
            if b == a or len(fa.names) < min_ratio * len(fb.names) or not real <= fb.names.keys():
                continue
            if not set(fa.paths).isdisjoint(fb.paths) and not related_in_one_file(fa, fb):
                continue
            if len([n for n in fa.names if n not in fb.names]) > 4:
                continue
            found.add(b)
        if found:
            out[a] = found
    return out


class Pairs(Relation):
    def __init__(self, families, min_support, min_ratio):
        self.n, self.c = len(families), _pairs(families, min_support, min_ratio)

    def classes(self):
        return _canonical(self.n, [(a, b) for a, bs in self.c.items() for b in bs if a in self.c.get(b, ())])

    def above(self, a, class_of):
        return self.c.get(a, set())

    def inside(self, small, big):
        return any(b in self.c.get(a, ()) for a in small for b in big)


def _fixture() -> list[Family]:
    """Many families sharing name sets (methods per layer class, per-backend switches), some in one file,
    enums with bound markers, supersets, dict keys and values of one literal, and unrelated sets."""
    files: list[FileMembers] = []
    ops = [f"OP_{x}" for x in ("ADD", "MUL", "SILU", "GELU", "ROPE", "NORM")]
    files.append(FileMembers("include/ops.h", "cpp", "b0", [("enum", "op", o, i + 1, "") for i, o in
                                                           enumerate([*ops, "OP_COUNT"])]))
    for k in range(12):  # one switch per backend, some backends in one file, some missing one op
        path = f"src/backend{k // 3}.cpp"
        labels = ops if k % 4 else ops[:-1]
        files.append(FileMembers(path, "cpp", f"s{k}", [("case", f"supports_{k}", o, i, "") for i, o in enumerate(labels)]))
    for k in range(30):  # methods every layer class has
        rows = [("py-methods", f"Layer{k}", f"op_{i}", i + 1, "") for i in range(4)]
        files.append(FileMembers(f"py/layer{k % 7}.py", "python", f"m{k}", rows))
    keys = ["add", "mul", "silu", "gelu", "rope", "norm", "topk"]
    files.append(FileMembers("py/table.py", "python", "t", [("dict", "KERNELS", f'"{x}"', i, f"k.{x}")
                                                           for i, x in enumerate(keys)]
                             + [("dict-values", "KERNELS", x, i, "") for i, x in enumerate(keys)]))
    files.append(FileMembers("py/other.py", "python", "o", [("list", "NAMES", f'"{x}"', i, "") for i, x in
                                                           enumerate(["a", "b", "c", "d", "e"])]))
    return build_families(files, 4)


def test_containment_by_name_set_equals_every_pair_and_mines_the_same_rules():
    fams = _fixture()
    assert len(fams) > 40
    fast, slow = Containment(fams, 4, 0.5), Pairs(fams, 4, 0.5)
    assert fast.pairs() == slow.c and slow.c  # the same A → B, pair for pair
    assert fast.classes() == slow.classes()
    got, want = mine(fams, 4, relation=fast), mine(fams, 4, relation=slow)
    assert [(i.kind, [f.id for f in i.families], i.exceptions) for i in got] == \
        [(i.kind, [f.id for f in i.families], i.exceptions) for i in want]
    assert got  # the fixture holds relations, so the comparison is not of two empty lists
    by_class = defaultdict(set)
    for i, c in enumerate(fast.classes()):
        by_class[c].add(fams[i].kind)
    assert any(kinds == {"py-methods"} for kinds in by_class.values())  # the layer methods joined as one class
