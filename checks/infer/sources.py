"""Lists that name other things of the tree: build lists naming source files, a package's imports and ``__all__``.

Mined apart from the name families (checks/infer/mine.py): their partner is no family of another file.

- **Source lists.** A Python file (setup.py, a JIT spec) or a CMake file whose strings name C-family source files
  (``"csrc/norm.cu"``, ``add_library(x norm.cu act.cu)``) that all exist in the tree at base (two are enough: a
  JIT spec naming a kernel and its binding), or at least ``min_support`` of which do, 3 in 4 (the rest, files built
  elsewhere or a submodule's, are recorded as allowed): the list names files. A PR that renames or deletes a file the list still names, or adds an entry
  for a file that is not there, deviates. Names compare by the file's stem (``csrc/norm.cu`` → ``norm``), the
  way a path fact keys files, so a list naming a file from another directory still finds it.
- **Exports.** A package's ``__init__.py`` whose ``__all__`` holds exactly the names it imports from its own
  package (relative imports, or imports from a package its path names), at least ``min_support``: adding one
  and not the other (a class exported and never imported, an import never exported) deviates.
- **Registration by import.** A module that imports every other module of its directory (``from .llama import
  LlamaModel`` for each model file beside it, at least ``min_support`` of them) is where they register: a module
  added to the directory and not imported there never registers, and deviates. Private (``_x.py``) and test
  modules are left out; the importer may import more (a subpackage, a module elsewhere).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from checks.config import Fact, Pillar, Rule
from checks.infer.families import CMAKE_SOURCE, KIND_BY_NAME, SRC_EXTS, FileMembers, query_text
from checks.infer.rules import pillar_of

SMALL_LIST = 2  # entries a build list needs (all of them files of the tree) to be a rule
STEM_SUB = r"^.*/|\..*$"  # a listed path's stem, as a path fact's {stem} is the file name up to its first dot


def stem(path: str) -> str:
    return path.rsplit("/", 1)[-1].split(".")[0]


@dataclass
class SourceList:
    path: str
    lang: str  # "python" | "cmake"
    names: dict[str, tuple[str, int]] = field(default_factory=dict)  # stem → (as written, line)
    absent: list[str] = field(default_factory=list)  # stems not in the tree at base: allowed
    exts: tuple[str, ...] = ()


def source_lists(files: list[FileMembers], paths: list[str], min_support: int) -> list[SourceList]:
    on_disk = {stem(p) for p in paths if p.rsplit(".", 1)[-1] in SRC_EXTS}
    out = []
    for fm in files:
        names: dict[str, tuple[str, int]] = {}
        exts: set[str] = set()
        for kind, _, raw, line, _ in fm.members:
            if kind != "src-file":
                continue
            s = stem(raw)
            if s:
                names.setdefault(s, (raw, line))
                exts.add(raw.rsplit(".", 1)[-1])
        present = [n for n in names if n in on_disk]
        # A build list names real files by nature, so two entries are enough, when both are files of the tree; from
        # min_support entries on, one in four may be built elsewhere (a submodule's, a generated one).
        if len(present) < SMALL_LIST or (len(present) < len(names) and (len(present) < min_support
                                                                          or len(present) * 4 < 3 * len(names))):
            continue
        out.append(SourceList(fm.path, fm.lang, names, sorted(n for n in names if n not in on_disk), tuple(sorted(exts))))
    return out


def _slug(path: str) -> str:
    return re.sub(r"[^\w.-]+", "-", path)[:40]


def _digest(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:6]


def source_rule(sl: SourceList, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    """Facts and a same-set rule: every stem the list names is a file of the tree (the tree may hold more)."""
    options = {"sub": {"key": [STEM_SUB, ""]}}
    if sl.lang == "cmake":
        listed = Fact(id=f"src-file@{sl.path}", lang="regex", files=[sl.path], regex=CMAKE_SOURCE, options=options)
    else:
        listed = Fact(id=f"src-file@{sl.path}", lang="python", files=[sl.path],
                      query=query_text(KIND_BY_NAME["src-file"], None, "python"), options=options)
    disk = Fact(id=f"files:{'+'.join(sl.exts)}", lang="path", files=[f"**/*.{e}" for e in sl.exts],
                options={"key": "{stem}"})
    rule_opts: dict = {"extra_ok": [disk.id]}
    if sl.absent:
        rule_opts["exceptions"] = {disk.id: list(sl.absent)}
    n = len(sl.names) - len(sl.absent)
    where = f"{sl.path}:{min(line for _, line in sl.names.values())}"
    what = f"source files named in {sl.path}"
    examples = [f"e.g. {raw} ({sl.path}:{line})" for raw, line in list(sl.names.values())[:3]]
    rule = Rule(
        id=f"inferred-src-files-{_slug(sl.path)}-{_digest(listed.id, disk.id)}",
        kind="same-set",
        facts=[listed.id, disk.id],
        pillar=pillar_of(sl.path, pillars),
        severity=severity,
        message=f"inferred at base (support {n}): every source file {sl.path} names is a file of the tree",
        options=rule_opts,
        source="inferred",
        evidence=[f"support {n}: every one of the {n} {what} ({where}) is a file of the tree", *examples]
        + ([f"allowed to differ: {', '.join(sl.names[a][0] for a in sl.absent)} (not in the tree at base)"]
           if sl.absent else []),
    )
    line = f"{rule.id}: every source file {sl.path} names is a file of the tree ({n} files)"
    return [listed, disk], rule, line


# --------------------------------------------------------------------------- exports


@dataclass
class Exports:
    path: str
    package: tuple[str, ...]  # the directories of the path: an import from one of them is the package's own
    names: dict[str, tuple[int, int]] = field(default_factory=dict)  # name → (import line, __all__ line)


def _own(module: str, package: tuple[str, ...]) -> bool:
    return module.startswith(".") or module.split(".", 1)[0] in package


def export_lists(files: list[FileMembers], min_support: int) -> list[Exports]:
    out = []
    for fm in files:
        if fm.lang != "python" or fm.path.rsplit("/", 1)[-1] != "__init__.py":
            continue
        package = tuple(p for p in fm.path.split("/")[:-1] if p.isidentifier())
        if not package:
            continue
        imported: dict[str, int] = {}
        listed: dict[str, int] = {}
        for kind, ctx, raw, line, _ in fm.members:
            if kind == "py-imports" and _own(ctx, package) and not raw.startswith("_"):
                imported.setdefault(raw, line)
            elif kind == "list" and ctx == "__all__" and not raw.startswith("_"):
                listed.setdefault(raw, line)
        if len(imported) >= min_support and imported.keys() == listed.keys():
            out.append(Exports(fm.path, package, {n: (imported[n], listed[n]) for n in imported}))
    return out


def export_rule(ex: Exports, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    own = "|".join(re.escape(p) for p in ex.package)
    imports = Fact(id=f"py-imports@{ex.path}", lang="python", files=[ex.path],
                   query=query_text(KIND_BY_NAME["py-imports"], None, "python",
                                    extra=f'(#match? @_ctx "^([.]|({_esc(own)})([.]|$))") (#not-match? @key "^_")'))
    exported = Fact(id=f"list:__all__@{ex.path}", lang="python", files=[ex.path],
                    query=query_text(KIND_BY_NAME["list"], "__all__", "python", extra="(#not-match? @key \"^[\\\"']_\")"))
    n = len(ex.names)
    examples = [f"e.g. {name} ({ex.path}:{a}) = \"{name}\" ({ex.path}:{b})" for name, (a, b) in list(ex.names.items())[:3]]
    rule = Rule(
        id=f"inferred-exports-{_slug(ex.path)}-{_digest(imports.id, exported.id)}",
        kind="same-set",
        facts=[imports.id, exported.id],
        pillar=pillar_of(ex.path, pillars),
        severity=severity,
        message=f"inferred at base (support {n}): the names {ex.path} imports from its package are its __all__",
        options={},
        source="inferred",
        evidence=[f"support {n}: the {n} names {ex.path} imports from its own package are exactly its __all__",
                  *examples],
    )
    return [imports, exported], rule, f"{rule.id}: the names {ex.path} imports from its package are its __all__ ({n} names)"


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


# --------------------------------------------------------------------------- registration by import


@dataclass
class SiblingImports:
    path: str  # the importing module
    directory: str
    modules: dict[str, int] = field(default_factory=dict)  # sibling module → line of its import


def _siblings_of(path: str, paths_by_dir: dict[str, list[str]]) -> list[str]:
    directory, _, name = path.rpartition("/")
    out = []
    for p in paths_by_dir.get(directory, []):
        base = p.rsplit("/", 1)[-1]
        if base == name or base.startswith("_") or base.startswith("test_") or base.endswith("_test.py"):
            continue
        out.append(base[:-3])
    return out


def sibling_imports(files: list[FileMembers], paths: list[str], min_support: int) -> list[SiblingImports]:
    """Modules that import every other (public, non-test) module of their directory by a relative import."""
    by_dir: dict[str, list[str]] = {}
    for p in paths:
        if p.endswith(".py"):
            by_dir.setdefault(p.rpartition("/")[0], []).append(p)
    out = []
    for fm in files:
        if fm.lang != "python":
            continue
        imported: dict[str, int] = {}
        for kind, ctx, raw, line, _ in fm.members:
            if kind != "py-imports":
                continue
            if ctx == ".":
                imported.setdefault(raw.split(".")[0], line)
            elif _RELATIVE.match(ctx):
                imported.setdefault(ctx[1:], line)
        if len(imported) < min_support:
            continue
        siblings = _siblings_of(fm.path, by_dir)
        if len(siblings) >= min_support and all(s in imported for s in siblings):
            out.append(SiblingImports(fm.path, fm.path.rpartition("/")[0], {s: imported[s] for s in siblings}))
    return out


_RELATIVE = re.compile(r"^[.][A-Za-z_]\w*$")
_IMPORTS_QUERY = ('(import_from_statement module_name: (relative_import) @key (#match? @key "^[.][A-Za-z_][A-Za-z0-9_]*$"))\n'
                  '(import_from_statement module_name: (relative_import) @_m name: [(dotted_name) @key '
                  '(aliased_import name: (dotted_name) @key)] (#eq? @_m "."))')


def sibling_rule(si: SiblingImports, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    """Facts and a same-set rule: every public module of the directory is imported by ``si.path`` (at base), or at
    head by some module of the directory (a helper a sibling imports is loaded with it, by a relative import or by
    its full name)."""
    d = si.directory
    package = d.rsplit("/", 1)[-1]
    absolute = ("\n(import_from_statement module_name: (dotted_name) @key "
                f'(#match? @key "(^|[.]){_esc(re.escape(package))}[.][A-Za-z_][A-Za-z0-9_]*$"))') if package else ""
    imports = Fact(id=f"py-modules@{si.path}", lang="python", files=[f"{d}/*.py" if d else "*.py"],
                   query=_IMPORTS_QUERY + absolute, options={"sub": {"key": [r"^.*[.]", ""]}})
    name = si.path.rsplit("/", 1)[-1]
    globs = [f"{d}/*.py" if d else "*.py"] + [f"!{d + '/' if d else ''}{g}" for g in
                                              (name, "__init__.py", "_*.py", "test_*.py", "*_test.py")]
    modules = Fact(id=f"modules:{d or '.'}/*.py", lang="path", files=globs, options={"key": "{stem}"})
    n = len(si.modules)
    where = f"{d}/" if d else "the top directory"
    examples = [f"e.g. {m} ({si.path}:{line}) = {d + '/' if d else ''}{m}.py" for m, line in list(si.modules.items())[:3]]
    rule = Rule(
        id=f"inferred-imports-{_slug(si.path)}-{_digest(imports.id, modules.id)}",
        kind="same-set",
        facts=[imports.id, modules.id],
        pillar=pillar_of(si.path, pillars),
        severity=severity,
        message=f"inferred at base (support {n}): {si.path} imports every module of {where} (or one of them does)",
        options={"extra_ok": [imports.id]},
        source="inferred",
        evidence=[f"support {n}: {si.path} imports each of the {n} other modules of {where} (where they register)",
                  *examples],
    )
    return [imports, modules], rule, f"{rule.id}: {si.path} imports every module of {where} ({n} modules)"


__all__ = ["SourceList", "Exports", "SiblingImports", "source_lists", "source_rule", "export_lists", "export_rule",
           "sibling_imports", "sibling_rule"]
