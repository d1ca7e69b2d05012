"""Mining: which name families agree across files at base (after Engler et al., "Bugs as Deviant Behavior").

If every member of family A (an enum, a switch, a table) also appears in
family B in another file, and A has enough members for that not to be chance,
the code believes "A ⊆ B". A PR that adds a member to A and not to B deviates
from that belief. Families are compared on normalised names: quotes, case,
``_``/``-``, the family's shared upper-case prefix (``GGML_OP_``) and the usual
registration affixes (``register_``, ``_task``) carry no meaning, and a schema
string keeps only its name (``"rms_norm(Tensor x) -> Tensor"`` → ``rmsnorm``).

The normalisation is one regex substitution plus lower-casing, exactly what a
``[[fact]]`` can say with ``sub`` and ``case``, so the fact engine at head
produces the names mined here.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from checks.infer.families import KIND_BY_NAME, KINDS, OWNER, FileMembers

NAME = re.compile(r"^[A-Za-z_][\w.:]*$")
AFFIXES = r"(?i:^(?:register_|task_|op_))|(?i:(?:_task|_op|_kernel|_impl|_fn)$)"
CUT = r"[\s(<].*$"
# Families that use names rather than declare them: a relation needs a declaring side (enum, table, registry).
_USES = {"case", "py-functions", "py-methods", "py-class-methods"}
_SIBLINGS = {k.name for k in KINDS if k.siblings}
# Families that are only ever the bigger side of a relation: every task's header included (``#include "linear.cuh"``)
# is a belief; a header included for a helper is none, so they never join a class and are never the smaller side.
# A class's methods are the bigger side of an interface only (a base's abstract methods): a class adding a helper is no
# drift, and two classes with the same methods agree by history, not by design.
_SUPERSET_ONLY = {"c-include", "py-class-methods"}
_INTERFACE = {"py-class-methods"}  # supersets of abstract-method families (``py-abstract``) only
_ORDERED = {"enum", "array", "list", "py-enum"}  # (a Cython enum mirrors its C++ enum by name: no order fact)  # declarations whose order can carry meaning (indexed tables)
_INDEXES = {"enum", "py-enum"}  # ... the side whose positions are the indices
_TABLES = {"array", "list"}  # ... the side indexed by them
CASE_CLASS_MIN = 8  # switches that agree with no declared list must share at least this many labels
PREDICATE_CLASS_MIN = 16  # ... and twice as many when every one is a predicate (each case returns true or false)
# Members a family may hold and its partner lack: sentinels, not names.
SENTINEL = re.compile(
    r"(?i)(^|_)(count|begin|end|first|last|max|min|num|size|total|invalid|unknown|none|all|default)$|^(num|max|n)_"
)


@dataclass
class Family:
    """One family at base: where it is, how its names normalise, its members by normalised name."""

    kind: str
    ctx: str
    lang: str
    paths: list[str]  # one path, or the files of a repo-wide (registration) family
    prefix: str
    suffix: str = ""
    label: str = ""  # case labels: the enum prefix they were split by ("" = every label of the function)
    not_labels: tuple[str, ...] = ()  # longer sibling prefixes left out (``kernel_mul_mm_id_`` of ``kernel_mul_mm_``)
    names: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # norm → (raw, path, line)
    values: dict[str, str] = field(default_factory=dict)  # norm → value text (tables)
    order: list[str] = field(default_factory=list)  # declarations (enum, array, list): names in line order

    @property
    def id(self) -> str:
        where = self.paths[0] if len(self.paths) == 1 else f"**/*.{self.lang}"
        label = f"[{self.label}*]" if self.label else ""
        return f"{self.kind}:{self.ctx}{label}@{where}"

    @property
    def repo_wide(self) -> bool:
        return KIND_BY_NAME[self.kind].repo_wide

    def describe(self) -> str:
        where = self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files"
        return f"{self.what()} ({where})"

    def what(self) -> str:
        """The family in words, without its file: ``case labels in ggml_compute_forward`` (a finding adds file:line)."""
        what = {
            "enum": "enum", "case": "case labels in", "array": "array", "c-register": "registrations via",
            "py-enum": "enum class", "pyx-enum": "Cython enum", "c-include": "headers included by", "dict": "dict keys of", "list": "list", "compare": "names compared with",
            "py-register": "registrations via", "c-map": "map entries of", "c-compare": "names compared with", "py-methods": "methods of class", "dict-attr": "dict keys of", "c-list": "table",
            "py-abstract": "abstract methods of class", "py-class-methods": "methods of class",
            "py-functions": "functions", "dict-values": "dict values of", "host-name": "kernels named",
        }.get(self.kind, self.kind)  # a kind added in families.py alone still reads
        if self.kind == "c-include":
            return "included headers"
        if self.label and self.kind == "case":
            what = f"case labels {self.label}* in"
        elif self.label:
            what = f"{what} {self.label}*"
            if self.not_labels:
                what += " (other than " + ", ".join(f"{q}*" for q in self.not_labels) + ")"
            if KIND_BY_NAME[self.kind].whole_file:
                return what
        return f"{what} {self.ctx}"

    @property
    def sub(self) -> str:
        """The regex (replaced by "") that, with lower-casing, turns a raw member into its name."""
        parts = [CUT]
        if self.prefix:
            parts.append("^" + re.escape(self.prefix))
        if self.suffix:
            parts.append(re.escape(self.suffix) + "$")
        parts += [AFFIXES, "[_-]"]
        return "|".join(parts)


@dataclass
class Invariant:
    """A relation that held at base: ``core`` families hold the same names, each ``superset`` holds them all."""

    kind: str  # "same-set" | "table-equal" | "order-equal" (run as table-equal over positions) | "keep" (see _kept)
    core: list[Family]
    supersets: list[Family] = field(default_factory=list)
    exceptions: dict[str, list[str]] = field(default_factory=dict)  # family id → names it may lack

    @property
    def families(self) -> list[Family]:
        return self.core + self.supersets

    @property
    def support(self) -> int:
        return len(self.core[0].names)

    @property
    def files(self) -> int:
        return len({p for f in self.families for p in f.paths})


def normalise(raw: str, sub: re.Pattern) -> str:
    return sub.sub("", raw).lower()


def _prefix(raws: list[str]) -> str:
    """The ``_``- or ``::``-ended prefix every member shares (``GGML_OP_``, ``register_``, ``MaskMode::``), with the
    ``k`` of constants written ``kCausal`` after it (``MaskMode::kCausal`` and ``kCausal`` both name ``causal``), or ""."""
    if len(raws) < 3:
        return ""
    common = raws[0][: len(_common(raws))]
    cut, colon = common.rfind("_"), common.rfind("::")
    if colon >= 0 and colon + 2 > cut + 1:
        common = common[: colon + 2]
    elif cut > 0:
        common = common[: cut + 1]
    else:
        common = ""
    rest = [r[len(common):] for r in raws]
    if all(len(x) > 1 and x[0] == "k" and (x[1].isupper() or x[1].isdigit()) for x in rest):
        common += "k"
    return "" if not common or any(len(r) == len(common) for r in raws) else common


_ATTR = re.compile(r"^(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*$")


def _owner_prefix(raws: list[str]) -> str:
    """The ``Owner.`` every key of an enum-keyed table shares (``QuantMethod.``, ``ir.DataType.``), or ""."""
    if not raws or not all(_ATTR.match(r) for r in raws):
        return ""
    owners = {r.rsplit(".", 1)[0] for r in raws}
    return next(iter(owners)) + "." if len(owners) == 1 else ""


def _prefix_groups(raws: list[str], min_size: int) -> list[str]:
    """``_``-ended prefixes shared by at least ``min_size`` names and by more of them than any longer one."""
    counts: dict[str, int] = defaultdict(int)
    for r in set(raws):
        for i, ch in enumerate(r[:-1]):
            if ch == "_" and i > 0:
                counts[r[: i + 1]] += 1
    keep = [p for p, n in counts.items() if n >= min_size]
    return sorted(p for p in keep if not any(q != p and q.startswith(p) and counts[q] == counts[p] for q in keep))


def _suffix(raws: list[str]) -> str:
    """The ``_``-started suffix every member shares (``_layer``, ``_TASK``), or ""."""
    if len(raws) < 3:
        return ""
    common = _common([r[::-1] for r in raws])[::-1]
    cut = common.find("_")
    if cut < 0:
        return ""
    common = common[cut:]
    return "" if any(len(r) == len(common) for r in raws) else common


def _common(raws: list[str]) -> str:
    first = raws[0]
    n = 0
    for i, ch in enumerate(first):
        if all(len(r) > i and r[i] == ch for r in raws):
            n = i + 1
        else:
            break
    return first[:n]


def build_families(files: list[FileMembers], min_size: int) -> list[Family]:
    """Group members into families, drop those too small or not made of names."""
    groups: dict[tuple, list[tuple[str, str, int, str]]] = defaultdict(list)
    langs: dict[tuple, str] = {}
    for fm in files:
        for kind, ctx, raw, line, value in fm.members:
            if KIND_BY_NAME[kind].fn_key or KIND_BY_NAME[kind].apart:
                continue  # counted per function (mine_counts), or mined apart (checks/infer/sources.py)
            key = (kind, fm.lang, ctx) if KIND_BY_NAME[kind].repo_wide else (kind, fm.path, ctx)
            groups[key].append((raw, fm.path, line, value))
            langs[key] = fm.lang
    # A switch may mix labels of several enums: each enum's share is a family of its own too.
    enum_prefixes = sorted({_prefix(sorted({re.sub(CUT, "", r[0]) for r in rows})) for (k, _, _), rows in groups.items()
                            if k == "enum"} - {""}, key=len, reverse=True)
    for key, rows in list(groups.items()):
        if key[0] != "case":
            continue
        split: dict[str, list] = defaultdict(list)
        for row in rows:
            label = next((p for p in enum_prefixes if row[0].startswith(p)), "")
            if label:
                split[label].append(row)
        for label, part in split.items():
            if len(part) < len(rows):
                groups[(f"case[{label}]", key[1], key[2])] = part
                langs[(f"case[{label}]", key[1], key[2])] = langs[key]
    enum_names = {ctx for (k, _, ctx) in groups if k in ("enum", "py-enum", "pyx-enum")}
    # Definitions are a family only by a shared prefix (``apply_liger_kernel_to_*``): one per such prefix.
    carved: dict[tuple, tuple[str, ...]] = {}
    for key, rows in list(groups.items()):
        if key[0].endswith("]") or not KIND_BY_NAME[key[0]].affixed:
            continue
        labels = _prefix_groups([r[0] for r in rows], min_size)
        for label in labels:
            part = [r for r in rows if r[0].startswith(label)]
            if KIND_BY_NAME[key[0]].siblings:
                inner = _siblings(label, [q for q in labels if q != label and q.startswith(label)], part)
                if inner:
                    part = [r for r in part if not r[0].startswith(inner)]
                    carved[(f"{key[0]}[{label}]", key[1], key[2])] = inner
            groups[(f"{key[0]}[{label}]", key[1], key[2])] = part
            langs[(f"{key[0]}[{label}]", key[1], key[2])] = langs[key]
    out: list[Family] = []
    for key, rows in groups.items():
        kind, _, ctx = key
        label = ""
        if kind.endswith("]"):
            kind, _, label = kind[:-1].partition("[")
        cut = [re.sub(CUT, "", r[0]) for r in rows]
        named = ctx == "<module>" or NAME.match(ctx.replace("->", "."))
        if len(set(cut)) < min_size or not all(NAME.match(c) for c in cut) or not named:
            continue
        if any(ch in ctx for ch in '"\\*?[') or any(ch in p for _, p, _, _ in rows for ch in "*?[!"):
            continue
        names = sorted(set(cut))
        prefix, suffix = _prefix(names), _suffix(names)
        if kind == "dict-attr":  # ``QuantMethod.AWQ``: the member, as its enum class names it
            prefix = _owner_prefix(names)
            if not prefix or prefix[:-1].rsplit(".", 1)[-1] not in enum_names:
                continue  # keys of a module (``torch.float16``) or a class this tree declares no enum of
        if KIND_BY_NAME[kind].affixed and not label:
            continue
        if kind == "pyx-enum" and not prefix:
            continue  # its regex fact reads an enum by its members' prefix
        paths = sorted({p for _, p, _, _ in rows})
        fam = Family(kind, ctx, langs[key], paths, prefix, suffix, label=label, not_labels=carved.get(key, ()))
        sub = re.compile(fam.sub)
        for raw, path, line, value in rows:
            name = normalise(raw, sub)
            if not name:
                continue
            fam.names.setdefault(name, (raw, path, line))
            if value:
                fam.values.setdefault(name, value)
        if kind in _ORDERED and len(paths) == 1:
            fam.order = [n for n, (raw, _, _) in sorted(fam.names.items(), key=lambda kv: kv[1][2])
                         if not SENTINEL.search(re.sub(CUT, "", raw))]
        if len(fam.names) >= min_size:
            out.append(fam)
    return out


def _siblings(label: str, longer: list[str], rows: list) -> tuple[str, ...]:
    """The longer prefix groups under ``label`` that mirror the rest of it: ``kernel_mul_mm_id_q4_0_f32`` beside
    ``kernel_mul_mm_q4_0_f32``, where at least half the names after the longer prefix are names of the rest."""
    out: list[str] = []
    for q in sorted(longer, key=len):
        if any(q.startswith(o) for o in out):
            continue
        inner = {r[0][len(q):] for r in rows if r[0].startswith(q)}
        rest = {r[0][len(label):] for r in rows if not r[0].startswith(q)}
        if inner and len(inner & rest) * 2 >= len(inner):
            out.append(q)
    return tuple(out)


def mine(families: list[Family], min_support: int, min_ratio: float = 0.5, max_rules: int = 200,
         relation: Relation | None = None) -> list[Invariant]:
    """Containment and equal tables between families in different files, strongest first.

    Families that contain each other (up to sentinels such as ``COUNT``) form one class, checked
    as one same-set rule; a class inside bigger families is checked against the smallest of them
    only (the bigger ones have their own rule), so one missed name gives one finding.
    ``relation``: who contains whom (default: ``Containment``, near-linear in the families).
    """
    rel = relation if relation is not None else Containment(families, min_support, min_ratio)
    class_of = rel.classes()
    classes: dict[int, list[int]] = defaultdict(list)
    for i in range(len(families)):
        classes[class_of[i]].append(i)
    out: list[Invariant] = []
    kept: set[str] = set()
    for cid, idx in classes.items():
        core = [families[i] for i in sorted(idx, key=lambda i: (-len(families[i].names), families[i].id))]
        if any(f.kind in _SUPERSET_ONLY for f in core):
            continue  # a file's headers may grow (a helper header) without any list following
        if sum(1 for f in core if f.kind == "py-abstract") > 1:
            continue  # two bases with the same abstract methods are copies (a backend's fork of the server tree)
        rep = next(i for i in idx if families[i] is core[0])
        declares = [f for f in core if f.kind not in _USES]
        # Supersets, as classes: keep the smallest ones (transitive reduction).
        sup = {class_of[b] for b in rel.above(rep, class_of) if class_of[b] != cid}
        if all(f.kind in ("case", "array") for f in core):  # the compiler already keeps labels inside their enum
            sup = {c for c in sup if not any(families[i].kind == "enum" for i in classes[c])}
        if not all(f.kind == "py-abstract" for f in core):  # a class's methods hold an interface, not any list
            sup = {c for c in sup if not all(families[i].kind in _INTERFACE for i in classes[c])}
        minimal = {c for c in sup if not any(o != c and rel.inside(classes[o], classes[c]) for o in sup)}
        supersets = [max((families[i] for i in classes[c]), key=lambda f: (len(f.names), f.id)) for c in sorted(minimal)]
        keep = _kept(core, supersets, min_support)
        if keep is not None:
            out.append(keep)
            kept.add(keep.core[0].id)
        switches_only = not declares and not any(f.kind not in _USES for f in supersets)
        if switches_only and any(f.kind != "case" for f in core + supersets):
            continue  # helper functions named alike in two modules is chance, not a registry
        if switches_only and (len(core) < 2 or len(core[0].names) < CASE_CLASS_MIN):
            continue  # a few switches agreeing is chance; many labels in exactly the same set is a belief
        if switches_only and all(_predicate(f) for f in core) and len(core[0].names) < PREDICATE_CLASS_MIN:
            continue  # feature predicates agreeing (two reorder paths supporting the same types) is history, not design
        if switches_only:
            supersets = []
        if len(core) < 2 and not supersets:
            continue
        if not switches_only and len({p for f in core + supersets for p in f.paths}) < 2 and not (
            {f.kind for f in core + supersets} & (_USES | _SIBLINGS)
        ):
            continue
        owners = [_owner(f) for f in core]
        if not supersets and all(f.kind == "enum" for f in core) and all(owners) and len(set(owners)) == len(owners):
            continue  # enums private to different classes (two kernels' TMEM layouts) agree by copy, not by design
        inv = Invariant("same-set", core, supersets)
        universe = set().union(*(f.names for f in core))
        for f in core:
            lack = sorted(n for n in universe if n not in f.names)
            if lack and all(any(_sentinel(g, n) for g in core if n in g.names) for n in lack):
                inv.exceptions[f.id] = lack
            elif lack:
                break
        else:
            for f in supersets:
                lack = sorted(n for n in core[0].names if n not in f.names)
                if lack:
                    inv.exceptions[f.id] = lack
            out.append(inv)
        ordered = [f for f in core if f.order and len(f.order) == len(set(f.order))]
        # An enum and the table indexed by it: same names at the same positions. Two copies of an enum, or two
        # lists (sphinx extensions in two conf.py), hold the same names, but neither indexes the other: their
        # order is no invariant, and the same-set rule already checks their names.
        for first in (f for f in ordered if f.kind in _INDEXES):
            second = next((o for o in ordered if o.kind in _TABLES and o.order == first.order
                           and o.paths != first.paths), None)
            if second is not None and len(first.order) >= min_support:
                out.append(Invariant("order-equal", [first, second]))
                break
        tables = [f for f in core if f.kind == "dict" and len(f.values) == len(f.names)]
        if len(tables) >= 2 and all(_same_values(tables[0], t) for t in tables[1:]):
            out.append(Invariant("table-equal", tables[:2]))
    out += [inv for inv in copies(families, min_support) if inv.core[0].id not in kept]
    out.sort(key=lambda inv: (-inv.support, -inv.files, inv.core[0].id))
    return out[:max_rules]


KEEP_EXTRAS = 2  # a switch or table inside a list with at most this many more names keeps the names it shares with it
TABLE_KEEP_MIN = 16  # ... from this many names for a declared table (a registry; a kernel's small enum is its own)
COPY_MIN = 5  # names a table needs to keep what it shares with the table it copies
_TABLES_KEPT = {"list", "dict", "array", "c-list", "dict-attr", "enum", "py-enum", "pyx-enum"}  # declared tables a keep rule may hold
_COPIED = {"list", "dict", "array", "c-list"}  # tables a same-named table of another file copies (an enum so named is a variant)
_ENUMS = {"enum", "py-enum", "pyx-enum"}
# Words that say what a variable is, not which: ``key``, ``kwargs``, ``choices`` and ``names`` lists of two files are
# alike by idiom (an autotune key, an option list), so only a name of two telling words marks a copy.
_GENERIC_WORDS = {"key", "keys", "kwargs", "args", "choices", "names", "name", "values", "value", "items", "data",
                  "list", "dict", "map", "mapping", "table", "all", "default", "defaults", "options", "config", "str",
                  "headers", "fields", "params", "result", "results", "out", "output", "outputs", "inputs", "tmp"}


def _words(name: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name)
            if w.lower() not in _GENERIC_WORDS and len(w) > 1]


def _basenames(f: Family) -> set[str]:
    return {p.rsplit("/", 1)[-1] for p in f.paths}


def _mirror(small: Family, big: Family) -> bool:
    """``small`` copies ``big`` in another file: the same table by a telling name (``allowed_archs``, not ``key``) in
    a file otherwise named (a file and its fork, ``sm_90/fwd.h`` and ``sm_120/fwd.h``, differ by design), or an enum
    mirrored in another language (a Python ``IntEnum`` of the C++ ``enum llm_arch``)."""
    if set(small.paths) & set(big.paths) or _basenames(small) & _basenames(big):
        return False
    if small.kind == big.kind and small.ctx == big.ctx and small.kind in _COPIED:
        return len(_words(small.ctx)) >= 2
    return small.kind in _ENUMS and big.kind in _ENUMS and small.lang != big.lang


def _kept(core: list[Family], supersets: list[Family], min_support: int = 4) -> Invariant | None:
    """A switch or table inside a list with only a name or two more, or inside the table it copies: it keeps every
    name it shares with it.

    Containment alone says nothing when the smaller side loses a name (a backend's type switch dropping ``Q5_0``
    that its sibling still handles; a supported-models list losing two names to a missing comma): the smaller side
    may always shrink. When the two differ by at most ``KEEP_EXTRAS`` names (recorded: the list may hold them
    alone), the smaller is the list less those extras, and a name the list still holds that it dropped deviates.
    Switches (a ``case`` chain is what dispatch looks like) and declared tables of one kind, at least
    ``CASE_CLASS_MIN`` names; feature predicates need twice as many. A copy (``_mirror``) keeps its names whatever
    the other holds besides, from ``min_support`` names.
    """
    if not supersets or len({f.kind for f in core}) != 1:
        return None
    kind = core[0].kind
    if kind not in _TABLES_KEPT | {"case"}:
        return None
    if kind == "case" and all(_predicate(f) for f in core) and len(core[0].names) < PREDICATE_CLASS_MIN:
        return None
    names = set(core[0].names)
    mirrors = [f for f in supersets if len(core) == 1 and _mirror(core[0], f)]
    pool = mirrors or supersets
    closest = min(pool, key=lambda f: (len(set(f.names) - names), f.id))
    extras = set(closest.names) - names
    if not KIND_BY_NAME[closest.kind].pattern:
        return None  # a list read by a regex (Cython enum, includes): no query to restrict to the shared names
    if kind == "case" and closest.kind in _ENUMS:
        return None  # the compiler keeps labels inside their enum; a switch handles the part of it it needs
    if not extras or any(f.repo_wide for f in core + [closest]):
        return None
    if not mirrors and (len(extras) > KEEP_EXTRAS or len(names) < (CASE_CLASS_MIN if kind == "case" else TABLE_KEEP_MIN)):
        return None
    if not mirrors and kind != "case" and any(_basenames(f) & _basenames(closest) for f in core):
        return None  # a file and its fork (a backend's copy of the server tree) differ by design
    if len(names) < (min_support if kind == "case" or not mirrors else max(min_support, COPY_MIN)):
        return None
    if any(not set(f.paths).isdisjoint(closest.paths) for f in core):
        return None  # sibling tables of one file (per-arch tuning) drop entries on purpose; backends in two files do not
    return Invariant("keep", list(core), [closest], exceptions={closest.id: sorted(extras)})


def copies(families: list[Family], min_support: int) -> list[Invariant]:
    """Keep rules for copies too small beside their original for containment's size ratio: a table of one name in
    two files (a validation list copied with its function), the smaller inside the bigger."""
    by: dict[tuple[str, str], list[Family]] = defaultdict(list)
    for f in families:
        if f.kind in _COPIED and not f.repo_wide and len(f.paths) == 1:
            by[(f.kind, f.ctx)].append(f)
    out: list[Invariant] = []
    for group in by.values():
        if len(group) < 2:
            continue
        for small in group:
            real = {n for n in small.names if not _sentinel(small, n)}
            if len(real) < max(min_support, COPY_MIN):
                continue
            bigger = [b for b in group if b is not small and real <= set(b.names) and len(b.names) > len(small.names)
                      and 2 * len(small.names) < len(b.names)]  # within the ratio, mine() has the pair already
            inv = _kept([small], bigger, min_support) if bigger else None
            if inv is not None:
                out.append(inv)
    return out


def self_named(families: list[Family], min_support: int) -> list[Family]:
    """Maps that name each key: ``task_type_to_name[TASK_LINEAR] = "TASK_LINEAR"``, ``names[OP_ADD] = "add"``.

    When every entry's string, normalised as the keys are, is its key (at least ``min_support`` entries), the
    map spells its keys, and an entry spelled otherwise (``"TASK_LINAER"``) is a typo the compiler cannot see.
    """
    out = []
    for fam in families:
        if fam.kind != "c-map" or len(fam.names) < min_support or len(fam.values) != len(fam.names):
            continue
        sub = re.compile(fam.sub)
        strings = [_unquoted(fam.values[n]) for n in fam.names]
        if not all(NAME.match(v) for v in strings):
            continue  # descriptions ("rmsnorm kernel"), not names: the cut before a space would make them look alike
        if all(normalise(v, sub) == n for v, n in zip(strings, fam.names, strict=True)):
            out.append(fam)
    return out


def _unquoted(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" else text


def _owner(family: Family) -> str:
    """The class declaring an enum family, when it is nested in one (see families._owner_class)."""
    return next((v[len(OWNER):] for v in family.values.values() if v.startswith(OWNER)), "")


def _predicate(family: Family) -> bool:
    """A switch whose every case returns true or false (or falls through to one that does)."""
    kinds = {family.values.get(n, "") for n in family.names}
    return family.kind == "case" and "bool" in kinds and kinds <= {"bool", "fall"}


def _sentinel(family: Family, name: str) -> bool:
    """A ``COUNT``/``*_BEGIN``-style member: bounds and markers, which the family's partners may lack."""
    raw = family.names[name][0] if name in family.names else name
    return bool(SENTINEL.search(re.sub(CUT, "", raw)))


def related_in_one_file(fa: Family, fb: Family) -> bool:
    """Families of one file relate only as switches against switches, definitions against the table that
    lists them, or a prefix group and the sibling carved out of it (``kernel_mul_mm_*``, ``kernel_mul_mm_id_*``;
    not two nested groups that merely look alike, ``kernel_mul_mm_iq2_*`` and ``kernel_mul_mm_iq3_*``); never
    two views of one literal (a dict's keys and values)."""
    if fa.kind == fb.kind and fa.kind in _SIBLINGS:  # only a group and the sibling carved out of it
        return bool(fb.label) and (fb.label in fa.not_labels or fa.label in fb.not_labels)
    return fa.ctx != fb.ctx and (fa.kind in _USES or fb.kind in _USES)


class Relation:
    """Who contains whom: family A → B when every name of A that is no sentinel is in B (see ``Containment``)."""

    def classes(self) -> list[int]:
        """Per family, its class: families that contain each other, joined; a class is named by its lowest index."""
        raise NotImplementedError

    def above(self, a: int, class_of: list[int]) -> Iterable[int]:
        """Families B with A → B (enough to know their classes)."""
        raise NotImplementedError

    def inside(self, small: list[int], big: list[int]) -> bool:
        """Whether some family of ``small`` is inside some family of ``big``."""
        raise NotImplementedError


def _canonical(n: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in edges:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the lowest index is the root: class ids do not depend on order
    return [root(i) for i in range(n)]


class Containment(Relation):
    """Containment between families, computed once per distinct name set.

    Many families share one name set (methods every class of a layer has, one switch per backend), and
    every pair of them contains each other: pairs are quadratic, name sets are few. A → B holds when
    A's name set is inside B's (a test per pair of name sets, through an index by name) and A and B are
    not two views of one place (``_apart``); classes are joined by a search over the name-set graph
    that visits each family once, so the cost is near-linear in the families plus the pairs kept apart.
    """

    def __init__(self, families: list[Family], min_support: int, min_ratio: float):
        self.families = families
        groups: dict[tuple[frozenset, frozenset], int] = {}
        self.group_of: list[int] = []
        self.members: list[list[int]] = []
        reals: list[frozenset] = []
        for i, f in enumerate(families):
            real = frozenset(n for n in f.names if not _sentinel(f, n))
            g = groups.setdefault((frozenset(f.names), real), len(groups))
            if g == len(self.members):
                self.members.append([])
                reals.append(real)
            self.members[g].append(i)
            self.group_of.append(g)
        names = [frozenset(families[m[0]].names) for m in self.members]
        # A class's methods may hold far more than the interface it implements: no size ratio for them.
        interface = [all(families[i].kind in _INTERFACE for i in m) for m in self.members]
        index: dict[str, list[int]] = defaultdict(list)
        for g, ns in enumerate(names):
            for n in ns:
                index[n].append(g)
        # up[g]: name sets that hold every real name of g, not much bigger, lacking at most 4 of its names.
        self.up: list[list[int]] = []
        for g, real in enumerate(reals):
            found: list[int] = []
            if len(real) >= min_support:
                rarest = min(real, key=lambda n: len(index[n]))
                size = len(names[g])
                for h in index[rarest]:
                    if (size < min_ratio * len(names[h]) and not interface[h]) or not real <= names[h] or len(
                            names[g] - names[h]) > 4:
                        continue
                    found.append(h)
            self.up.append(found)
        self.paths = [frozenset(f.paths) for f in families]
        self.group_paths = [frozenset().union(*(self.paths[i] for i in m)) for m in self.members]

    def _apart(self, a: int, b: int) -> bool:
        if self.families[a].kind in _SUPERSET_ONLY or self.families[b].kind in _SUPERSET_ONLY:
            return False  # never joined into a class; a superset only through ``above``, across files
        return a != b and (self.paths[a].isdisjoint(self.paths[b]) or related_in_one_file(self.families[a],
                                                                                            self.families[b]))

    def pairs(self) -> dict[int, set[int]]:
        """Every A → B (quadratic: for tests on small inputs)."""
        out: dict[int, set[int]] = {}
        for a in range(len(self.families)):
            found = {b for h in self.up[self.group_of[a]] for b in self.members[h] if self._apart(a, b)}
            if found:
                out[a] = found
        return out

    def classes(self) -> list[int]:
        ups = [set(u) for u in self.up]
        mutual = [[h for h in self.up[g] if g in ups[h]] for g in range(len(self.up))]
        unvisited = [set(m) for m in self.members]
        edges: list[tuple[int, int]] = []
        for start in range(len(self.families)):
            g0 = self.group_of[start]
            if start not in unvisited[g0]:
                continue
            unvisited[g0].discard(start)
            queue = [start]
            while queue:
                a = queue.pop()
                for h in mutual[self.group_of[a]]:
                    left = unvisited[h]
                    if not left:
                        continue
                    joined = [b for b in left if self._apart(a, b)]
                    for b in joined:
                        left.discard(b)
                        edges.append((a, b))
                        queue.append(b)
        return _canonical(len(self.families), edges)

    def above(self, a: int, class_of: list[int]) -> Iterable[int]:
        for h in self.up[self.group_of[a]]:
            members = self.members[h]
            if self.paths[a].isdisjoint(self.group_paths[h]):
                # No member shares a file with A: every one is above it; one per class is enough.
                seen: set[int] = set()
                for b in members:
                    if class_of[b] not in seen:
                        seen.add(class_of[b])
                        yield b
                continue
            yield from (b for b in members if self._apart(a, b) or (
                self.families[b].kind in _SUPERSET_ONLY and self.paths[a].isdisjoint(self.paths[b])))

    def inside(self, small: list[int], big: list[int]) -> bool:
        by_group: dict[int, list[int]] = defaultdict(list)
        for b in big:
            by_group[self.group_of[b]].append(b)
        for a in small:
            for h in self.up[self.group_of[a]]:
                if any(self._apart(a, b) for b in by_group.get(h, ())):
                    return True
        return False


def _same_values(a: Family, b: Family) -> bool:
    from checks.rules.table_equal import _norm

    return a.names.keys() == b.names.keys() and all(_norm(a.values[n]) == _norm(b.values[n]) for n in a.names)


# --------------------------------------------------------------------------- count agreement


@dataclass
class Counted:
    """Per function of one file: how many ``ctx`` calls it makes, or the number it declares as ``ctx``."""

    kind: str  # "py-calls" | "c-int"
    ctx: str  # the callee attribute (``new_input``) or the variable (``num_inputs``)
    lang: str
    path: str
    affix: str  # the functions' shared prefix or suffix, as a fnmatch scope (``*_layer``, ``register_*``)
    sub: str  # the regex that, with lower-casing, turns a function name into its key
    values: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # key → (number, function, line)

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.ctx}[{self.affix}]@{self.path}"

    def describe(self) -> str:
        return f"{self.what()} ({self.path})"

    def what(self) -> str:
        if self.kind == "py-calls":
            return f"calls of .{self.ctx}() per function {self.affix}"
        return f"{self.ctx} per function {self.affix}"


def counted_families(files: list[FileMembers], min_size: int) -> list[Counted]:
    """Functions that share an affix, each with a count: the unit of a count-agreement relation."""
    per: dict[tuple[str, str, str], dict[str, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    langs: dict[tuple[str, str, str], str] = {}
    for fm in files:
        for kind, ctx, fn, line, value in fm.members:
            if kind in ("py-calls", "c-int") and fn and "*" not in fn and "?" not in fn and "[" not in fn:
                per[(kind, fm.path, ctx)][fn].append((line, value))
                langs[(kind, fm.path, ctx)] = fm.lang
    out: list[Counted] = []
    for (kind, path, ctx), by_fn in per.items():
        names = sorted(by_fn)
        for affix, sub in _affix_groups(names, min_size):
            fam = Counted(kind, ctx, langs[(kind, path, ctx)], path, affix, sub)
            pattern = re.compile(sub)
            for fn in names:
                if not _fnmatch(fn, affix):
                    continue
                rows = by_fn[fn]
                if kind == "py-calls":
                    number = len(rows)
                else:
                    if len(rows) != 1:
                        continue  # declared twice in one function: no single number
                    try:
                        number = int(rows[0][1].rstrip("uUlL"), 0)
                    except ValueError:
                        continue
                key = pattern.sub("", fn).lower()
                if key and key not in fam.values:
                    fam.values[key] = (number, fn, rows[0][0])
            if len(fam.values) >= min_size:
                out.append(fam)
    return out


def mine_counts(families: list[Counted], min_support: int) -> list[tuple[Counted, Counted]]:
    """(calls, declared) pairs in different files that agree on every shared function, and share most."""
    calls = [f for f in families if f.kind == "py-calls"]
    declared = [f for f in families if f.kind == "c-int"]
    out = []
    for a in calls:
        for b in declared:
            if not _akin(a.ctx, b.ctx):
                continue
            shared = a.values.keys() & b.values.keys()
            if len(shared) < min_support or len(shared) * 5 < 4 * max(len(a.values), len(b.values)):
                continue
            # One number everywhere (every op has 1 output) is weaker evidence: it needs one more function.
            constant = len({a.values[k][0] for k in shared}) == 1
            if all(a.values[k][0] == b.values[k][0] for k in shared) and len(shared) >= min_support + constant:
                out.append((a, b))
    return out


def _akin(callee: str, variable: str) -> bool:
    """``new_input`` counts what ``num_inputs`` declares; ``register_task`` and ``num_outputs`` agreeing is chance."""
    stem = re.sub(r"^(new|add|append|emit|create|declare|register)_", "", callee).rstrip("s")
    return bool(stem) and stem in re.sub(r"^(num|n)_", "", variable)


def _fnmatch(name: str, affix: str) -> bool:
    return name.startswith(affix[:-1]) if affix.endswith("*") else name.endswith(affix[1:])


def _affix_groups(names: list[str], min_size: int) -> list[tuple[str, str]]:
    """(fnmatch scope, key regex) per ``_`` prefix or suffix that at least ``min_size`` names share."""
    out = []
    for p in _prefix_groups(names, min_size):
        out.append((f"{p}*", "|".join([CUT, "^" + re.escape(p), AFFIXES, "[_-]"])))
    for s in _prefix_groups([n[::-1] for n in names], min_size):
        suffix = s[::-1]
        out.append((f"*{suffix}", "|".join([CUT, re.escape(suffix) + "$", AFFIXES, "[_-]"])))
    return out


# --------------------------------------------------------------------------- functions named after their constant


@dataclass
class Named:
    """Functions sharing an affix that each hand ``callee`` the constant named like them (``register_x_task`` →
    ``register_task_variant(TASK_X, ...)``)."""

    path: str
    lang: str
    callee: str
    affix: str  # the functions' fnmatch scope (``register_*``)
    sub: str  # function name → key
    const_sub: str  # constant → key
    values: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # key → (constant, function, line)


def named_constants(files: list[FileMembers], min_support: int) -> list[Named]:
    """Per file and callee: an affix group of at least ``min_support`` functions, each calling ``callee`` once with
    a constant, where every constant (its shared ``_`` prefix and the usual affixes dropped) is the function's key.
    A function handing on another's constant (``register_embedding_task`` passing ``TASK_RMSNORM``) deviates."""
    per: dict[tuple[str, str], dict[str, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    langs: dict[tuple[str, str], str] = {}
    for fm in files:
        for kind, ctx, fn, line, value in fm.members:
            if kind == "c-call-const" and fn and NAME.match(fn) and NAME.match(ctx.replace("->", ".")):
                per[(fm.path, ctx)][fn].append((line, value))
                langs[(fm.path, ctx)] = fm.lang
    out: list[Named] = []
    for (path, callee), by_fn in per.items():
        once = {fn: rows[0] for fn, rows in by_fn.items() if len(rows) == 1}
        if len(once) < min_support:
            continue
        for affix, sub in _affix_groups(sorted(once), min_support):
            fns = [fn for fn in sorted(once) if _fnmatch(fn, affix)]
            consts = [once[fn][1] for fn in fns]
            prefix = _prefix(sorted(set(consts)))
            const_sub = "|".join([CUT] + (["^" + re.escape(prefix)] if prefix else []) + [AFFIXES, "[_-]"])
            pattern, cpattern = re.compile(sub), re.compile(const_sub)
            got = Named(path, langs[(path, callee)], callee, affix, sub, const_sub)
            for fn in fns:
                key = pattern.sub("", fn).lower()
                line, const = once[fn]
                if not key or normalise(const, cpattern) != key or key in got.values:
                    break
                got.values[key] = (const, fn, line)
            else:
                if len(got.values) >= min_support and len(set(consts)) == len(consts):
                    out.append(got)
    return out
