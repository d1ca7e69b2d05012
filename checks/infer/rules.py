"""Invariants as config: each inferred relation becomes ``[[fact]]`` and ``[[rule]]`` objects.

Inferred rules run through the same rule engine as declared ones (same-set for
containment, table-equal for copied tables), so their findings have the same
Finding type, states and fingerprints. The fact is the family's own tree-sitter
pattern restricted to its context, with the mined normalisation as ``sub`` and
``case``; the rule carries its evidence (support and example rows).
"""

from __future__ import annotations

import hashlib
import re

from checks.config import Fact, Pillar, Rule
from checks.globs import matches
from checks.infer.families import _QUOTE, INCLUDE_REGEX, KIND_BY_NAME, _escape, cython_enum_regex, query_text
from checks.infer.mine import Counted, Family, Invariant, Named

LANG_GLOBS = {
    "python": ["**/*.py", "**/*.pyi"],
    "c": ["**/*.c"],
    "cpp": ["**/*.h", "**/*.hpp", "**/*.hh", "**/*.hxx", "**/*.cc", "**/*.cpp", "**/*.cxx"],
    "cuda": ["**/*.cu", "**/*.cuh"],
}
_NOT_VENDORED = [f"!**/{d}/**" for d in ("third_party", "3rdparty", "vendor", "vendors", "external", "extern", "deps",
                                           "node_modules", "build", "dist", "test", "tests", "example", "examples", "benchmark",
                                           "benchmarks")]
_NOT_VENDORED += ["!**/test_*.py", "!**/*_test.py"]


# Bound markers (COUNT, *_END) hold no position in the table an enum indexes (tree-sitter regex syntax).
_NOT_SENTINEL = ('(#not-match? @value "(?i)(^[\\"\']?|_)(count|begin|end|first|last|max|min|num|size|total|invalid|unknown|'
                 'none|all|default)[\\"\']?$|^[\\"\']?(num|max|n)_")')  # mine.SENTINEL, on quoted text too


def positional_fact_for(family: Family) -> Fact:
    """The family's names by position (row key = index), for an order relation."""
    kind = KIND_BY_NAME[family.kind]
    query = query_text(kind, family.ctx, family.lang, family.label, extra=_NOT_SENTINEL,
                       not_labels=family.not_labels).replace("@key", "@value")
    options: dict = {"key": "@index", "sub": {"value": [family.sub, ""]}, "case": {"value": "lower"}}
    return Fact(id=f"{family.id}#order", lang=family.lang, files=list(family.paths), query=query, options=options)


def fact_for(family: Family) -> Fact:
    kind = KIND_BY_NAME[family.kind]
    options: dict = {"sub": {"key": [family.sub, ""]}, "case": "lower"}
    if family.kind == "c-include":  # the file's quoted includes, by stem
        return Fact(id=family.id, lang="regex", files=list(family.paths), regex=INCLUDE_REGEX, options=options)
    if family.kind == "pyx-enum":  # no grammar: a regex over the file, by the enum's member prefix
        return Fact(id=family.id, lang="regex", files=list(family.paths), regex=cython_enum_regex(family.prefix),
                    options=options)
    if kind.scope:
        options["scope"] = f"function:{family.ctx}"
    files = LANG_GLOBS[family.lang] + _NOT_VENDORED if kind.repo_wide else list(family.paths)
    query = query_text(kind, family.ctx, family.lang, _label(family), not_labels=family.not_labels)
    return Fact(id=family.id, lang=family.lang, files=files, query=query, options=options)


def _label(family: Family) -> str:
    """The prefix a function's labels are read by at head: the enum they all had at base.

    A function that dispatched only on ``GGML_TYPE_*`` at base and gains ``cc == GGML_CUDA_CC_X`` tests at
    head has not lost its types; reading every constant would call the new ones missing elsewhere.
    """
    if family.label or family.kind != "case":
        return family.label
    return family.prefix if family.prefix.endswith("_") else ""


def rule_id(inv: Invariant) -> str:
    head = inv.core[0]
    where = head.label.rstrip("_") if head.ctx == "<module>" and head.label else head.ctx  # module-level groups
    slug = re.sub(r"[^\w.-]+", "-", f"{head.kind}-{where}").strip("-")[:48]
    digest = hashlib.sha1("\0".join([inv.kind, *(f.id for f in inv.families)]).encode()).hexdigest()[:6]
    return f"inferred-{slug}-{digest}"


def evidence(inv: Invariant, examples: int = 3) -> list[str]:
    head, others = inv.core[0], inv.families[1:]
    if inv.kind == "order-equal":
        lines = [f"support {len(head.order)}: {head.describe()} and {others[0].describe()} list the same names "
                 "in the same order (one indexes the other)"]
    elif inv.kind == "table-equal":
        lines = [f"support {inv.support}: {head.describe()} and {others[0].describe()} map every key to the same value"]
    else:
        if len(inv.core) == 1 and inv.supersets:  # one list inside others: "holds the same 19 names" said nothing
            lines = [f"support {inv.support}: every one of the {inv.support} names of {head.describe()} is also in "
                     + ", ".join(f.describe() for f in inv.supersets)]
        else:
            rel = "hold exactly the same" if not inv.supersets else "hold the same"
            lines = [f"support {inv.support}: {', '.join(f.describe() for f in inv.core)} {rel} {inv.support} names"]
            if inv.supersets:
                lines.append("each also in " + ", ".join(f.describe() for f in inv.supersets))
    for name in list(head.names)[:examples]:
        raw, path, line = head.names[name]
        pairs = [f"{raw} ({path}:{line})"]
        for other in others[:2]:
            if name in other.names:
                oraw, opath, oline = other.names[name]
                pairs.append(f"{oraw} ({opath}:{oline})")
        lines.append("e.g. " + " = ".join(pairs))
    by_id = {f.id: f for f in inv.families}
    for fid, names in inv.exceptions.items():
        fam = by_id.get(fid)
        raws = [next((g.names[n][0] for g in inv.families if n in g.names), n) for n in names]
        what = fam.what() if fam is not None else fid
        lines.append(f"allowed to differ: {what} lacks {', '.join(raws)} (a bound marker, not a name)")
    return lines


def summary(inv: Invariant) -> str:
    if inv.kind == "keep":
        what = _and([f.describe() for f in inv.core])
        return f"{what} keep{'s' if len(inv.core) == 1 else ''} the names shared with {inv.supersets[0].describe()}"
    if inv.kind == "order-equal":
        return f"{inv.core[0].describe()} and {inv.core[1].describe()} in the same order"
    if inv.kind == "table-equal":
        return f"{inv.core[0].describe()} equals {inv.core[1].describe()}"
    if inv.supersets and len(inv.core) == 1:
        return f"every name in {inv.core[0].describe()} is also in " + _and([f.describe() for f in inv.supersets])
    return _and([f.describe() for f in inv.core]) + " hold the same names" + (
        f" (each also in {_and([f.describe() for f in inv.supersets])})" if inv.supersets else ""
    )


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def kept_fact_for(family: Family, names: list[str]) -> Fact:
    """The family's rows restricted to ``names`` (as written at base): what a switch kept in step with it held."""
    kind = KIND_BY_NAME[family.kind]
    options: dict = {"sub": {"key": [family.sub, ""]}, "case": "lower"}
    if kind.scope:
        options["scope"] = f"function:{family.ctx}"
    alternation = "|".join(re.escape(n) for n in sorted(names))
    extra = f'(#match? @key "^{_QUOTE}({_escape(alternation)}){_QUOTE}$")'
    query = query_text(kind, family.ctx, family.lang, _label(family), extra=extra, not_labels=family.not_labels)
    digest = hashlib.sha1(alternation.encode()).hexdigest()[:6]
    return Fact(id=f"{family.id}#kept-{digest}", lang=family.lang, files=list(family.paths), query=query, options=options)


def to_config(inv: Invariant, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule]:
    if inv.kind == "keep":
        return _keep_config(inv, pillars, severity)
    facts = [positional_fact_for(f) if inv.kind == "order-equal" else fact_for(f) for f in inv.families]
    options: dict = {"field": "value"} if inv.kind == "order-equal" else {}
    if inv.kind == "same-set":
        if inv.supersets:
            options["extra_ok"] = [f.id for f in inv.supersets]
        if inv.exceptions:
            options["exceptions"] = dict(inv.exceptions)
    rule = Rule(
        id=rule_id(inv),
        kind="table-equal" if inv.kind == "order-equal" else inv.kind,
        facts=[f.id for f in facts],
        pillar=pillar_of(inv.core[0].paths[0], pillars),
        severity=severity,
        message=f"inferred at base (support {inv.support}): {summary(inv)}",
        options=options,
        source="inferred",
        evidence=evidence(inv),
    )
    return facts, rule


def _keep_config(inv: Invariant, pillars: list[Pillar], severity: str) -> tuple[list[Fact], Rule]:
    """Every name a switch shared with its closest list at base stays in the switch while the list holds it:
    same-set over the list's rows restricted to those names and the switch, the switch free to hold more."""
    bigger = inv.supersets[0]
    shared = [bigger.names[n][0] for n in inv.core[0].names if n in bigger.names]
    core = [fact_for(f) for f in inv.core]
    kept = kept_fact_for(bigger, shared)
    extras = inv.exceptions.get(bigger.id, [])
    raws = [bigger.names[n][0] for n in extras if n in bigger.names]
    what = _and([f.describe() for f in inv.core])
    line = (f"{what} keep{'s' if len(inv.core) == 1 else ''} every name {'it shares' if len(inv.core) == 1 else 'they share'}"
            f" with {bigger.describe()}, which has only {_and(raws)} besides")
    rule = Rule(
        id=rule_id(inv),
        kind="same-set",
        facts=[f.id for f in core] + [kept.id],
        pillar=pillar_of(inv.core[0].paths[0], pillars),
        severity=severity,
        message=f"inferred at base (support {inv.support}): {line}",
        options={"extra_ok": [f.id for f in core]},
        source="inferred",
        evidence=[f"support {inv.support}: every one of the {inv.support} names of {what} is also in {bigger.describe()}",
                  f"allowed to differ: {bigger.what()} also holds {', '.join(raws)}"]
        + evidence(inv)[1:4],
    )
    return [*core, kept], rule


def self_named_rule(family: Family, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    """A map whose every string names its key: table-equal between the strings and the keys themselves."""
    kind = KIND_BY_NAME[family.kind]
    options: dict = {"sub": {"key": [family.sub, ""], "value": [family.sub, ""]}, "case": {"key": "lower", "value": "lower"}}
    query = query_text(kind, family.ctx, family.lang)
    strings = Fact(id=f"{family.id}#names", lang=family.lang, files=list(family.paths), query=query, options=options)
    # The key node captured as the value too: each row's value is its own key.
    keys_query = query.replace("right: (string_literal) @value", "right: (string_literal)").replace(
        " @key)", " @key @value)", 1)
    keys = Fact(id=f"{family.id}#keys", lang=family.lang, files=list(family.paths), query=keys_query, options=options)
    n = len(family.names)
    where = family.describe()
    examples = [f"e.g. {family.names[k][0]} = {family.values[k]} ({family.names[k][1]}:{family.names[k][2]})"
                for k in list(family.names)[:3]]
    digest = hashlib.sha1(family.id.encode()).hexdigest()[:6]
    slug = re.sub(r"[^\w.-]+", "-", family.ctx).strip("-")[:40]
    rule = Rule(
        id=f"inferred-names-{slug}-{digest}",
        kind="table-equal",
        facts=[strings.id, keys.id],
        pillar=pillar_of(family.paths[0], pillars),
        severity=severity,
        message=f"inferred at base (support {n}): every string of {where} names its key",
        options={"field": "value"},
        source="inferred",
        evidence=[f"support {n}: every one of the {n} strings of {where} spells its key", *examples],
    )
    return [strings, keys], rule, f"{rule.id}: every string of {where} names its key ({n} entries)"


def pillar_of(path: str, pillars: list[Pillar]) -> str:
    for p in pillars:
        if p.id != "other" and p.paths and matches(p.paths, path):
            return p.id
    return "other"


# --------------------------------------------------------------------------- count agreement


def count_facts(a: Counted, b: Counted) -> tuple[Fact, Fact]:
    """Facts for "function k of A calls .ctx() as many times as function k of B declares": join-equal operands.

    Ids are plain identifiers: rule operands are ``FACT.FIELD`` expressions, where ``-`` and ``.`` mean something.
    """
    digest = hashlib.sha1("\0".join([a.id, b.id]).encode()).hexdigest()[:6]
    calls = Fact(
        id=f"calls_{a.ctx}_{digest}",
        lang=a.lang,
        files=[a.path],
        query=f'(call function: (attribute attribute: (identifier) @_m) (#eq? @_m "{a.ctx}")) @call @site',
        options={"key": "@function", "count": "call", "scope": f"function:{a.affix}",
                 "sub": {"key": [a.sub, ""]}, "case": {"key": "lower"}},
    )
    declared = Fact(
        id=f"declared_{b.ctx}_{digest}",
        lang=b.lang,
        files=[b.path],
        query=f'(declaration declarator: (init_declarator declarator: (identifier) @_v value: (number_literal) @value) '
              f'(#eq? @_v "{b.ctx}"))',
        options={"key": "@function", "scope": f"function:{b.affix}", "sub": {"key": [b.sub, ""]},
                 "case": {"key": "lower"}},
    )
    return calls, declared


def count_rule(a: Counted, b: Counted, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    calls, declared = count_facts(a, b)
    shared = sorted(a.values.keys() & b.values.keys())
    line = f"{a.describe()} = {b.describe()}"
    evidence = [f"support {len(shared)}: for every shared function, the number of .{a.ctx}() calls in {a.path} "
                f"equals {b.ctx} in {b.path}"]
    for k in shared[:3]:
        na, fa, la = a.values[k]
        nb, fb, lb = b.values[k]
        evidence.append(f"e.g. {fa} ({a.path}:{la}) calls .{a.ctx}() {na}x = {fb} ({b.path}:{lb}) {b.ctx} = {nb}")
    rule = Rule(
        id=f"inferred-count-{a.ctx}-{b.ctx}-{calls.id.rsplit('_', 1)[1]}",
        kind="join-equal",
        facts=[calls.id, declared.id],
        pillar=pillar_of(b.path, pillars),
        severity=severity,
        message=f"inferred at base (support {len(shared)}): {line}",
        options={"equal": [f"{calls.id}.count", f"{declared.id}.value"]},
        source="inferred",
        evidence=evidence,
    )
    return [calls, declared], rule, f"{rule.id}: {line} (support {len(shared)}, 2 files)"


# --------------------------------------------------------------------------- functions named after their constant


def named_rule(nm: Named, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    """join-equal within one fact: each function's key equals the key of the constant it hands ``callee``."""
    digest = hashlib.sha1("\0".join([nm.path, nm.callee, nm.affix]).encode()).hexdigest()[:6]
    slug = re.sub(r"\W+", "_", nm.callee).strip("_")[:32]
    fid = f"handed_{slug}_{digest}"
    query = (f"(call_expression function: [(identifier) (field_expression) (qualified_identifier)] @_ctx "
             f'arguments: (argument_list . (identifier) @task) (#eq? @_ctx "{_escape(nm.callee)}"))')
    if nm.lang == "c":
        query = query.replace(" (qualified_identifier)", "")
    fact = Fact(id=fid, lang=nm.lang, files=[nm.path], query=query,
                options={"key": "@function", "scope": f"function:{nm.affix}",
                         "sub": {"key": [nm.sub, ""], "task": [nm.const_sub, ""]},
                         "case": {"key": "lower", "task": "lower"}})
    n = len(nm.values)
    what = f"functions {nm.affix} in {nm.path}"
    examples = [f"e.g. {fn} ({nm.path}:{line}) calls {nm.callee}({const}, ...)"
                for const, fn, line in list(nm.values.values())[:3]]
    rule = Rule(
        id=f"inferred-handed-{slug}-{digest}",
        kind="join-equal",
        facts=[fid],
        pillar=pillar_of(nm.path, pillars),
        severity=severity,
        message=f"inferred at base (support {n}): each of the {what} hands {nm.callee}() the constant named like it",
        options={"equal": [f"{fid}.key", f"{fid}.task"]},
        source="inferred",
        evidence=[f"support {n}: each of the {n} {what} calls {nm.callee}() with the constant named like it", *examples],
    )
    return [fact], rule, f"{rule.id}: each of the {what} hands {nm.callee}() the constant named like it ({n} functions)"
