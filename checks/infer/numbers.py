"""Sizes a kernel dispatches on, against the sizes its front end accepts: numeric dispatch lists.

A C-family switch over a size (``switch (head_dim) { case 64: ... case 128: ... }``) and a Python test or list of
the same quantity (``assert head_dim in (64, 128)``, ``HEAD_DIMS = [64, 128, 256]``) name the sizes the code
supports. Mined apart from the name families: numbers are no names (every table holds a 64), so two lists relate
only when they are about the same thing, by their subject (the switched-on expression, the tested or assigned
name: ``params.head_dim``, ``head_dim``, ``HEAD_DIMS``, ``kHeadDim`` are one subject; ``d`` or ``n`` are none), and
only when every number is a size (at least 16, a multiple of 8) and there are at least three.

A relation holds when, at base, a Python family's sizes are all in a switch of another file on its subject (the front
end accepts what the kernel dispatches). The Python side accepting a size the switch lacks deviates; the kernel
dispatching a size the Python side does not accept yet is not flagged (the kernel may lead). Two switches (two
backends) or two Python lists (copies of one check) with the same sizes agree by history: no rule.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass, field

from checks.config import Fact, Pillar, Rule
from checks.infer.families import KIND_BY_NAME, OWNER, FileMembers, query_text
from checks.infer.mine import SENTINEL, Family, normalise
from checks.infer.rules import pillar_of, positional_fact_for

MIN_SIZES = 3
MIN_SIZE = 16
SIZE_STEP = 8
SUBJECT_MIN = 4  # characters a normalised subject needs (``d``, ``n``, ``dim`` say nothing)
SUFFIX_SUB = "[uUlL]+$"  # ``128u`` is 128


@dataclass
class Sizes:
    kind: str  # "c-num-case" | "py-num"
    lang: str
    path: str
    ctx: str  # the subject as written
    function: str = ""  # c-num-case: the function whose switch it is (the fact's scope)
    values: dict[int, tuple[str, int]] = field(default_factory=dict)  # number → (as written, line)

    @property
    def id(self) -> str:
        where = f"{self.function}:" if self.function else ""
        return f"{self.kind}:{where}{self.ctx}@{self.path}"

    def what(self) -> str:
        if self.kind == "c-num-case":
            return f"sizes switch ({self.ctx}) in {self.function} dispatches"
        return f"sizes {self.ctx} is tested against"

    def describe(self) -> str:
        return f"{self.what()} ({self.path})"


def subject(ctx: str) -> str:
    """``params.head_dim``, ``HEAD_DIMS``, ``kHeadDim``, ``self.headdim`` → ``headdim``; "" when too short to mean."""
    last = re.split(r"\.|->|::", ctx.strip())[-1].strip("()")
    if re.match(r"^k[A-Z]", last):
        last = last[1:]
    norm = last.replace("_", "").lower()
    if norm.endswith("s"):
        norm = norm[:-1]
    return norm if len(norm) >= SUBJECT_MIN and norm.isidentifier() else ""


def same_subject(a: str, b: str) -> bool:
    if not a or not b:
        return False
    short, long = sorted((a, b), key=len)
    return short == long or (len(short) > SUBJECT_MIN and long.endswith(short))


def _number(raw: str) -> int | None:
    text = re.sub(SUFFIX_SUB, "", raw.strip())
    return int(text) if text.isdigit() else None


def size_families(files: list[FileMembers]) -> list[Sizes]:
    groups: dict[tuple[str, str, str, str], Sizes] = {}
    for fm in files:
        for kind, ctx, raw, line, value in fm.members:
            if kind not in ("c-num-case", "py-num"):
                continue
            key = (kind, fm.path, value if kind == "c-num-case" else "", ctx)
            fam = groups.get(key)
            if fam is None:
                fam = groups[key] = Sizes(kind, fm.lang, fm.path, ctx, value if kind == "c-num-case" else "")
            n = _number(raw)
            fam.values.setdefault(n if n is not None else -1, (raw, line))
    out = []
    for fam in groups.values():
        nums = list(fam.values)
        if len(nums) >= MIN_SIZES and all(n >= MIN_SIZE and n % SIZE_STEP == 0 for n in nums) and subject(fam.ctx):
            out.append(fam)
    return out


def mine_sizes(families: list[Sizes]) -> list[tuple[Sizes, list[Sizes]]]:
    """(front end, switches): a Python family whose sizes are all in each switch of another file on its subject.

    Only the front end against the kernel: two switches (two backends) or two Python lists (copies of a check) holding
    the same sizes agree by history, and one of them gaining a size is no drift."""
    switches: dict[str, list[Sizes]] = defaultdict(list)
    for f in families:
        if f.kind == "c-num-case":
            switches[subject(f.ctx)].append(f)
    out: list[tuple[Sizes, list[Sizes]]] = []
    for a in families:
        if a.kind != "py-num":
            continue
        s = subject(a.ctx)
        bigger = [b for t, group in switches.items() if same_subject(s, t) for b in group
                  if b.path != a.path and set(a.values) <= set(b.values)]
        if bigger:
            out.append((a, sorted(bigger, key=lambda b: b.id)))
    return out


def _fact(fam: Sizes) -> Fact:
    kind = KIND_BY_NAME[fam.kind]
    options: dict = {"sub": {"key": [SUFFIX_SUB, ""]}}
    if fam.function:
        options["scope"] = f"function:{fam.function}"
    return Fact(id=fam.id, lang=fam.lang, files=[fam.path], query=query_text(kind, fam.ctx, fam.lang), options=options)


def size_rule(small: Sizes, bigger: list[Sizes], pillars: list[Pillar],
              severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    facts = [_fact(small)] + [_fact(b) for b in bigger]
    n = len(small.values)
    digest = hashlib.sha1("\0".join([small.id] + [b.id for b in bigger]).encode()).hexdigest()[:6]
    slug = re.sub(r"[^\w.-]+", "-", small.ctx).strip("-")[:32]
    where = ", ".join(b.describe() for b in bigger)
    line = f"every size of {small.describe()} is also in {where}"
    big = bigger[0]
    examples = [f"e.g. {raw} ({small.path}:{ln}) = {big.values[v][0]} ({big.path}:{big.values[v][1]})"
                for v, (raw, ln) in sorted(small.values.items())[:3]]
    rule = Rule(
        id=f"inferred-sizes-{slug}-{digest}",
        kind="same-set",
        facts=[f.id for f in facts],
        pillar=pillar_of(small.path, pillars),
        severity=severity,
        message=f"inferred at base (support {n}): {line}",
        options={"extra_ok": [f.id for f in facts[1:]]},
        source="inferred",
        evidence=[f"support {n}: {line} (one subject, {subject(small.ctx)})", *examples],
    )
    files = len({small.path, *(b.path for b in bigger)})
    return facts, rule, f"{rule.id}: {line} ({n} sizes, {files} files)"


# --------------------------------------------------------------------------- a table as long as the enum indexing it


INDEXED_MIN = 6  # entries an enum and its table need for their equal length to be no chance
_GENERIC = {"t", "e", "type", "types", "enum", "kind", "str", "strs", "string", "strings", "name", "names", "table",
            "to", "list", "arr", "array", "map", "of", "id", "ids", "k", "g", "s"}


def _words(ctx: str) -> list[str]:
    parts = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", ctx)
    return [w.lower() for w in parts if w.lower() not in _GENERIC]


def _akin(a: str, b: str) -> bool:
    """Two words for one thing: ``sample``/``sampling``, ``method``/``methods`` (a shared stem of 4 or more)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n >= 4 or a == b


def related_names(enum: str, table: str) -> bool:
    """``sample_method_t`` and ``sampling_methods_str``: every word of the shorter name (generic words left out)
    has a kin in the other."""
    a, b = _words(enum), _words(table)
    if not a or not b:
        return False
    short, long = sorted((a, b), key=len)
    return all(any(_akin(w, v) for v in long) for w in short)


@dataclass
class Indexed:
    """An enum and a table of another file, as long as each other and named alike: one indexes the other."""

    enum: Family
    table: Family
    length: int


def indexed_tables(files: list[FileMembers], families: list[Family], min_size: int = INDEXED_MIN) -> list[Indexed]:
    """Top-level C-family tables (of any entries: display strings, function pointers) exactly as long as an enum
    (bound markers left out on both) whose name they share, in another file, and whose names they do not hold
    (an enum and a table of the same names already have an order rule)."""
    enums = [f for f in families if f.kind == "enum" and len(f.paths) == 1 and len(f.order) >= min_size
             and not any(v.startswith(OWNER) for v in f.values.values())]
    if not enums:
        return []
    tables: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    langs: dict[tuple[str, str], str] = {}
    for fm in files:
        for kind, ctx, raw, line, _ in fm.members:
            if kind == "array":
                tables[(fm.path, ctx)].append((raw, line))
                langs[(fm.path, ctx)] = fm.lang
    by_len: dict[int, list[Family]] = defaultdict(list)
    for e in enums:
        by_len[len(e.order)].append(e)
    out = []
    for (path, ctx), rows in tables.items():
        entries = [r for r in rows if not SENTINEL.search(r[0])]
        for e in by_len.get(len(entries), []):
            if e.paths[0] == path or not related_names(e.ctx, ctx):
                continue
            sub = re.compile(e.sub)
            if {normalise(r, sub) for r, _ in entries} & set(e.order):
                continue  # it names the members: the order rule's business
            table = Family("array", ctx, langs[(path, ctx)], [path], "", names={
                str(i): (raw, path, line) for i, (raw, line) in enumerate(entries)})
            out.append(Indexed(e, table, len(entries)))
    return out


def indexed_rule(ix: Indexed, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    """same-set over positions: the table has an entry at every index of the enum, and no more."""
    a, b = positional_fact_for(ix.enum), positional_fact_for(ix.table)
    a.id, b.id = a.id.replace("#order", "#count"), b.id.replace("#order", "#count")
    digest = hashlib.sha1("\0".join([a.id, b.id]).encode()).hexdigest()[:6]
    slug = re.sub(r"[^\w.-]+", "-", ix.table.ctx).strip("-")[:32]
    line = f"{ix.table.describe()} has one entry per member of {ix.enum.describe()}"
    first = ix.table.names["0"]
    rule = Rule(
        id=f"inferred-indexed-{slug}-{digest}",
        kind="same-set",
        facts=[a.id, b.id],
        pillar=pillar_of(ix.table.paths[0], pillars),
        severity=severity,
        message=f"inferred at base (support {ix.length}): {line}",
        options={},
        source="inferred",
        evidence=[f"support {ix.length}: {ix.enum.describe()} has {ix.length} members (bound markers left out) and "
                  f"{ix.table.describe()} {ix.length} entries, and their names say one indexes the other",
                  f"e.g. {ix.enum.names[ix.enum.order[0]][0]} ({ix.enum.paths[0]}:{ix.enum.names[ix.enum.order[0]][2]})"
                  f" = {first[0]} ({first[1]}:{first[2]})"],
    )
    return [a, b], rule, f"{rule.id}: {line} ({ix.length} entries, 2 files)"


__all__ = ["Sizes", "size_families", "mine_sizes", "size_rule", "subject", "Indexed", "indexed_tables",
           "indexed_rule", "related_names"]
