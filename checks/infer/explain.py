"""Findings of inferred rules, said the way a reviewer reads them.

The rule kinds word a finding with the rule's fact ids and the normalised key
(``'ksizep' is in case:f@a.cpp but missing from dict:T@b.py``): right for a
declared rule, whose fact ids a maintainer chose, but opaque for an inferred
one. ``explain`` rewrites the message of every inferred finding: the name as
the source writes it (``kSizeP``), each side as a plain description with its
file and line, what the base believed, and the fix (add the name, or silence
the rule by the id the finding shows). Identity, state and locations are
untouched, so fingerprints and new / pre-existing / fixed states do not move.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from checks.config import Fact, Rule
from checks.infer.entry_points import MODULE_NAME
from checks.model import Finding, Location

_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|[A-Za-z_][\w]*(?:(?:::|\.)[A-Za-z_]\w*)*')
# The rule kind's wording: the key, or the name as written and the key it is compared as.
_SAME_SET = re.compile(r"^'(?:(?P<written>.*?)' \(compared as ')?(?P<key>.*?)'\)? is in (?P<have>.*) but missing from "
                       r"(?P<lack>.*)$", re.S)
_ONLY = re.compile(r"^'(?P<key>.*)' is in (?P<have>\S+) but not in (?P<lack>\S+)$", re.S)
_DIFFERS = re.compile(r"^'(?P<key>.*)' differs: (?P<a>\S+) has (?P<va>.*) \((?P<wa>[^()]*:\d+)\), "
                      r"(?P<b>\S+) has (?P<vb>.*) \((?P<wb>[^()]*:\d+)\)$", re.S)
_DISAGREES = re.compile(r"^key '(?P<key>.*)' disagrees: (?P<parts>.*)$", re.S)
_PART = re.compile(r"(?P<ref>[\w]+)\.(?P<field>\w+) = (?P<value>[^,()]*?) \((?P<where>[^()]*:\d+)\)")


class _Reader:
    """Lines of files at one revision, read once."""

    def __init__(self, tree: Any):
        self.tree = tree
        self.files: dict[str, list[str]] = {}

    def lines(self, path: str) -> list[str]:
        hit = self.files.get(path)
        if hit is None:
            data = None
            try:
                data = self.tree.read(path) if self.tree is not None else None
            except Exception:
                data = None
            hit = self.files[path] = (data or b"").decode("utf-8", "replace").splitlines()
        return hit

    def line(self, path: str, line: int) -> str:
        lines = self.lines(path)
        return lines[line - 1] if 0 < line <= len(lines) else ""


def _normaliser(fact: Fact | None, field: str) -> tuple[re.Pattern | None, str]:
    if fact is None:
        return None, ""
    sub = (fact.options.get("sub") or {}).get(field)
    case = fact.options.get("case")
    how = case if isinstance(case, str) and field == "key" else (case or {}).get(field, "") if isinstance(case, dict) else ""
    try:
        return (re.compile(sub[0]) if sub else None), how
    except (re.error, TypeError, IndexError):
        return None, how


def _norm(text: str, pattern: re.Pattern | None, how: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1]
    if pattern is not None:
        text = pattern.sub("", text)
    return text.lower() if how == "lower" else text.upper() if how == "upper" else text


def raw_name(reader: _Reader, fact: Fact | None, field: str, key: str, path: str, line: int, up: int = 0) -> str:
    """The token at ``path:line`` (or up to ``up`` lines above it) that normalises to ``key``, as written."""
    pattern, how = _normaliser(fact, field)
    for n in range(line, max(0, line - up - 1), -1):
        for m in _TOKEN.finditer(reader.line(path, n)):
            tok = m.group(0)
            cands = [tok] + ([tok.rsplit("::", 1)[-1].rsplit(".", 1)[-1]] if ("::" in tok or "." in tok) else [])
            for c in cands:
                if _norm(c, pattern, how) == key:
                    return c
    return ""


def _span(rows: list, path: str) -> str:
    lines = sorted(r.line for r in rows if r.path == path)
    if not lines:
        return path
    return f"{path}:{lines[0]}" if lines[0] == lines[-1] else f"{path}:{lines[0]}-{lines[-1]}"


def _rows(fact: Fact | None, tree: Any) -> list:
    if fact is None or tree is None:
        return []
    from checks.facts import extract

    try:
        return list(extract(fact, tree).rows)
    except Exception:
        return []


def _fix(rule: Rule) -> str:
    return (f"If the difference is intended, add \"{rule.id}\" to [settings] disable in "
            f".github/drift-audit.toml.")


def _support(rule: Rule) -> str:
    return next((e.split(":", 1)[0].removeprefix("support ") for e in rule.evidence if e.startswith("support ")), "")


def _quote(name: str) -> str:
    return name if name[:1] in "\"'" else f"`{name}`"


class Explainer:
    def __init__(self, rules: list[Rule], facts: list[Fact], labels: dict[str, str], head: Any, base: Any):
        self.rules = {r.id: r for r in rules}
        self.facts = {f.id: f for f in facts}
        self.labels = labels
        self.readers = {"head": _Reader(head), "base": _Reader(base)}
        self.trees = {"head": head, "base": base}
        self.rows: dict[tuple[str, str], list] = {}
        self.last: tuple[str, str] | None = None  # (where it is missing, the name) of the last same-set finding

    def label(self, fid: str) -> str:
        return self.labels.get(fid) or fid

    def fact_rows(self, fid: str, side: str) -> list:
        hit = self.rows.get((fid, side))
        if hit is None:
            hit = self.rows[(fid, side)] = _rows(self.facts.get(fid), self.trees[side])
        return hit

    def where(self, fid: str, side: str) -> str:
        rows = self.fact_rows(fid, side)
        if not rows:
            return ""
        paths = sorted({r.path for r in rows})
        return _span(rows, paths[0]) if len(paths) == 1 else f"{len(paths)} files, e.g. {_span(rows, paths[0])}"

    def _path(self, fid: str, side: str) -> str:
        rows = self.fact_rows(fid, side)
        fact = self.facts.get(fid)
        return rows[0].path if rows else (fact.files[0] if fact is not None and fact.files else fid)

    def written_like(self, have: str, lack: str, side: str) -> str:
        """How the other list writes a name both hold: ``(there "kernel_mul_mm_q4_0_f32" is written
        "kernel_mul_mm_id_q4_0_f32")``, so the reviewer sees the spelling the missing entry needs."""
        theirs = {r.key: r for r in self.fact_rows(lack, side)}
        reader = self.readers[side]
        for r in self.fact_rows(have, side):
            o = theirs.get(r.key)
            if o is None:
                continue
            a = raw_name(reader, self.facts.get(have), "key", r.key, r.path, r.line)
            b = raw_name(reader, self.facts.get(lack), "key", o.key, o.path, o.line)
            if a and b:
                same = a.strip("\"'") == b.strip("\"'")  # a string and the name it holds: the same spelling
                return f" (there {_quote(a)} is written {_quote(b)})" if not same else ""  # nothing to say
        return ""

    def __call__(self, f: Finding) -> Finding:
        rule = self.rules.get(f.rule)
        if rule is None or f.source != "inferred":
            return f
        detail = f.message[len(rule.message) + 2:] if rule.message and f.message.startswith(rule.message + ": ") else ""
        side = "base" if f.status == "fixed" else "head"
        try:
            text = self.rewrite(rule, detail, f, side)
        except Exception:  # wording must never lose a finding
            text = None
        if not text:
            return f
        return replace(f, message=text, locations=[self.note(rule, loc, side) for loc in f.locations],
                       evidence=list(f.evidence))


    def note(self, rule: Rule, loc: Location, side: str) -> Location:
        for fid in rule.facts:
            if loc.note.startswith(fid + " has ") or loc.note.startswith(fid + ": "):
                raw = ""
                key = loc.note.split(" has '", 1)[1][:-1] if " has '" in loc.note else ""
                fact = self.facts.get(fid)
                if key:  # the key, or already the name as written
                    raw = raw_name(self.readers[side], fact, "key", key, loc.path, loc.line)
                    return replace(loc, note=f"{self.label(fid)} lists {_quote(raw or key)} here")
                value = loc.note.split(": ", 1)[1]
                raw = raw_name(self.readers[side], fact, "value", value, loc.path, loc.line)
                return replace(loc, note=f"{self.label(fid)}: {_quote(raw or value)}")
        return loc

    def indexed(self, rule: Rule, key: str, have: str, lack: str, side: str) -> str:
        """A table indexed by an enum (or the enum) lacks the entry at one position."""
        rows = [r for r in self.fact_rows(have, side) if r.key == key]
        value = str(rows[0].values.get("value", "")) if rows else ""
        raw = raw_name(self.readers[side], self.facts.get(have), "value", value, rows[0].path, rows[0].line) if rows else ""
        at = f" ({rows[0].path}:{rows[0].line})" if rows else ""
        w = self.where(lack, side)
        entry = f"{_quote(raw or value)}, position {int(key) + 1} of {self.label(have)}{at}"
        support = _support(rule)
        return (f"{self.label(lack)}{f' ({w})' if w else ''} has no entry for {entry}. Fix: add the entry at that "
                f"position, or remove {_quote(raw or value)}. At the base the two had {support + ' ' if support else ''}"
                f"entries each, one per position, so one indexes the other. {_fix(rule)}")

    def rewrite(self, rule: Rule, detail: str, f: Finding, side: str) -> str | None:
        reader = self.readers[side]
        if rule.kind == "same-set":
            m = _SAME_SET.match(detail)
            if not m:
                return None
            key = m.group("key")
            have = [x for x in m.group("have").split(", ") if x in self.facts]
            lack = [x for x in m.group("lack").split(", ") if x in self.facts]
            if not have or not lack:
                return None
            raw = ""
            sides = []
            for fid in have:
                rows = [r for r in self.fact_rows(fid, side) if r.key == key]
                mine = (raw_name(reader, self.facts.get(fid), "key", key, rows[0].path, rows[0].line)
                        or getattr(rows[0], "written", "")) if rows else ""  # quotes kept: a string reads as one
                at = f"{rows[0].path}:{rows[0].line}" if rows else ""
                if mine and raw and mine != raw:
                    at += f", as {_quote(mine)}"
                raw = raw or mine
                sides.append(f"{self.label(fid)}" + (f" ({at})" if at else ""))
            name = _quote(raw or m.group("written") or key)
            if all(x.endswith("#count") for x in have + lack) and key.isdigit():
                return self.indexed(rule, key, have[0], lack[0], side)
            keyed = getattr(self.facts.get(lack[0]), "options", {}).get("key") if len(lack) == 1 else None
            if keyed == MODULE_NAME and ":" in key:  # a name a module must define: say which module lacks it
                modname, obj = key.rsplit(":", 1)
                module = next((r.path for r in self.fact_rows(lack[0], side) if r.key.rsplit(":", 1)[0] == modname), "")
                support = _support(rule)
                defines = (f"{module} defines no `{obj}` at module level" if module
                           else f"the tree has no module {modname} that defines `{obj}`")
                return (f"{name} is one of {_join(sides)}, but {defines}. Fix: define it there (or import it), or "
                        f"point the entry point at the object's new name. At the base each of the "
                        f"{support + ' ' if support else ''}entry points named an object its module defines. "
                        f"{_fix(rule)}")
            missing = []
            for fid in lack:
                w = self.where(fid, side)
                missing.append(self.label(fid) + (f" ({w})" if w else ""))
            files = [x for x in lack if getattr(self.facts.get(x), "lang", "") == "path"]
            if files:  # a list names a file the tree lacks: the fix is the entry (or the file), not the tree
                support = _support(rule)
                return (f"{name} is in {_join(sides)} but no file of the tree is named so "
                        f"({_join([self.label(x) for x in files])}). Fix: point the entry at the file's new name, "
                        f"remove it, or restore the file. At the base every one of the {support + ' ' if support else ''}"
                        f"files it names was in the tree. {_fix(rule)}")
            like = self.written_like(have[0], lack[0], side) if len(lack) == 1 else ""
            n = len(rule.facts)
            support = _support(rule)
            count = f"{support} " if support else ""
            extra = set(rule.options.get("extra_ok", []))
            if any("#kept-" in x for x in have):  # a switch dropped a name its closest list still holds
                besides = next((e.split(" also holds ", 1)[1] for e in rule.evidence if " also holds " in e), "")
                held = (f"At the base every one of the {count}names of {_join([self.label(x) for x in lack])} "
                        f"was also in {_join([self.label(x) for x in have])}"
                        + (f", which had only {besides} besides" if besides else "")
                        + ", so the code keeps the names they share in step.")
            elif extra and all(x in extra for x in lack):
                held = (f"At the base every one of the {count}names in {_join([self.label(x) for x in have])} "
                        f"was also in {_join([self.label(x) for x in lack])}, so the code keeps them in step.")
            else:
                held = (f"At the base {'these ' + str(n) + ' lists' if n > 2 else 'the two'} held the same "
                        f"{count}names, so the code keeps them in step.")
            # Two copies of one list (enum WarpRole in two kernels) read alike: the fix then names the file.
            alike = {self.label(x) for x in have} & {self.label(x) for x in lack}
            target = _join([self.label(x) + (f" in {self._path(x, side)}" if self.label(x) in alike else "")
                            for x in lack])
            self.last = (target, name)
            others = "the other" if len(have) == 1 else "the others"
            # The fix right after what is wrong: a comment clips long messages, and the belief is in the evidence too.
            return (f"{name} is in {_join(sides)} but missing from {_join(missing)}. "
                    f"Fix: add it to {target}{like}, or remove it from {others}. {held} {_fix(rule)}")
        if rule.kind == "table-equal":
            a_id, b_id = rule.facts
            ordered = a_id.endswith("#order")
            m = _DIFFERS.match(detail)
            if m:
                va, vb = m.group("va"), m.group("vb")
                pa, _, la = m.group("wa").rpartition(":")
                pb, _, lb = m.group("wb").rpartition(":")
                field = "value"
                ra = raw_name(reader, self.facts.get(a_id), field, va, pa, int(la)) or va
                rb = raw_name(reader, self.facts.get(b_id), field, vb, pb, int(lb)) or vb
                if ordered:
                    pos = m.group("key")
                    return (f"{self.label(a_id)} and {self.label(b_id)} must list the same names in the same order "
                            f"(one indexes the other), but the {_nth(pos)} name (bound markers such as COUNT not counted) is {_quote(ra)} at {pa}:{la} and "
                            f"{_quote(rb)} at {pb}:{lb} (inferred: at the base both listed the same names in the same "
                            f"order). Fix: reorder one of them to match the other. {_fix(rule)}")
                if a_id.endswith("#names") and b_id.endswith("#keys"):  # a map that spells its keys, misspelt
                    owner = self.label(a_id).removeprefix("the strings of ")
                    return (f"{owner} spells its key {_quote(rb)} as {_quote(ra)} at {pa}:{la}; at the base every "
                            f"entry's string named its key. Fix: write the key's name there. {_fix(rule)}")
                return (f"{_quote(m.group('key'))} maps to {_quote(ra)} in {self.label(a_id)} at {pa}:{la} but to "
                        f"{_quote(rb)} in {self.label(b_id)} at {pb}:{lb} (inferred: at the base the two tables were "
                        f"equal). Fix: make the two entries equal. {_fix(rule)}")
            o = _ONLY.match(detail)
            if o:
                only, absent = o.group("have"), o.group("lack")
                rows = [r for r in self.fact_rows(only, side) if r.key == o.group("key")]
                at = f" at {rows[0].path}:{rows[0].line}" if rows else ""
                if ordered:
                    raw = ""
                    if rows:
                        raw = raw_name(reader, self.facts.get(only), "value", str(rows[0].get("value")), rows[0].path,
                                       rows[0].line)
                    what = f"a {_nth(o.group('key'))} name" + (f" ({_quote(raw)})" if raw else "")
                    return (f"{self.label(only)} has {what}{at}, but {self.label(absent)} ({self.where(absent, side)}) "
                            f"has no entry at that position: the two must list the same names in the same order "
                            f"(inferred from the base). Fix: add the matching entry to {self.label(absent)}. {_fix(rule)}")
                raw = raw_name(reader, self.facts.get(only), "key", o.group("key"), rows[0].path, rows[0].line) if rows else ""
                name = _quote(raw or o.group("key"))
                return (f"{name} is in {self.label(only)}{at} but not in {self.label(absent)} ({self.where(absent, side)}) "
                        f"(inferred: at the base the two tables were equal). Fix: add {name} to {self.label(absent)}, "
                        f"or remove it from both. {_fix(rule)}")
            return None
        if rule.kind == "join-equal":
            d = _DISAGREES.match(detail)
            if not d:
                return None
            key = d.group("key")
            if rule.id.startswith("inferred-handed-"):  # a function handing on another function's constant
                got = {p.group("field"): p for p in _PART.finditer(d.group("parts"))}
                if "task" not in got:
                    return None
                where = got["task"].group("where")
                path, _, line = where.rpartition(":")
                fact = self.facts.get(rule.facts[0])
                eq = re.search(r'#eq\? @_\w+ "([^"]+)"', fact.query or "") if fact is not None else None
                callee = eq.group(1) if eq else "its callee"
                fn = raw_name(reader, fact, "key", key, path, int(line), up=400) or key
                const = raw_name(reader, fact, "task", got["task"].group("value"), path, int(line)) or got["task"].group("value")
                scope = str((fact.options if fact is not None else {}).get("scope", "")).removeprefix("function:")
                return (f"`{fn}` hands {callee}() `{const}` ({where}), the constant of another function: at the base each "
                        f"of the functions {scope} there handed it the constant named like itself. Fix: pass the "
                        f"constant named after `{fn}`. {_fix(rule)}")
            parts, seen = [], set()
            for p in _PART.finditer(d.group("parts")):
                fid, value = p.group("ref"), p.group("value")
                if fid in seen:
                    continue  # one row per side: the numbers that disagree
                seen.add(fid)
                path, _, line = p.group("where").rpartition(":")
                fn = raw_name(reader, self.facts.get(fid), "key", key, path, int(line), up=400) or key
                fact = self.facts.get(fid)
                query = fact.query if fact is not None else ""
                eq = re.search(r'#eq\? @_\w+ "([^"]+)"', query or "")
                target = eq.group(1) if eq else fid
                if p.group("field") == "count":
                    parts.append(f"`{fn}` calls .{target}() {value} time(s) ({path}:{line})")
                else:
                    parts.append(f"`{fn}` declares {target} = {value} ({path}:{line})")
            if len(parts) < 2:
                return None
            return (f"{parts[0]}, but {parts[1]} (inferred: at the base every shared function agreed). "
                    f"Fix: make the two numbers equal. {_fix(rule)}")
        return None


def _nth(index: str) -> str:
    """A 0-based position as a reviewer counts it, bound markers (``COUNT``, ``NONE``) not counted."""
    n = int(index) + 1 if index.isdigit() else 0
    if not n:
        return index
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _join(items: list[str]) -> str:
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def explain(findings: list[Finding], rules: list[Rule], facts: list[Fact], labels: dict[str, str], head: Any,
            base: Any) -> list[Finding]:
    """Every inferred finding reworded (raw names, plain sides with file:line, the fix); others untouched."""
    if not any(f.source == "inferred" for f in findings):
        return findings
    ex = Explainer(rules, facts, labels, head, base)
    out: list[Finding] = []
    groups: dict[tuple, list[tuple[int, str]]] = {}
    for f in findings:
        ex.last = None
        out.append(ex(f))
        if ex.last is not None:
            groups.setdefault((f.rule, f.status, ex.last[0]), []).append((len(out) - 1, ex.last[1]))
    for (_, _, target), members in groups.items():
        if len(members) < 2:
            continue
        names = [n for _, n in members]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        for i, _ in members:  # one drift, many names: each finding says so
            out[i] = replace(out[i], message=out[i].message + f" One of {len(names)} names missing from {target} "
                                                              f"together: {shown}.")
    return out


__all__ = ["explain", "raw_name"]
