"""Entry points: the console scripts and plugin entry points a package declares name objects its modules define.

``setup.cfg`` (``[options.entry_points]``), ``pyproject.toml`` (``[project.scripts]``, ``[project.gui-scripts]``,
``[project.entry-points.*]``, ``[tool.poetry.scripts]``) and ``setup.py`` (``entry_points={...}``) write them as
``name = package.module:object``. Each one whose module is a file of the tree at base and defines that object there
(a function, a class, an assignment or an import at module level) is believed: a PR that renames or drops the
object, or declares a script whose function is not there, deviates. Targets in a module outside the tree (an
installed dependency, a compiled extension) are left out. The declarations are read only where they name one of
the tree's own top-level packages, so another tool's ``"ignore:text"`` setting is no entry point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from checks.config import Fact, Pillar, Rule
from checks.infer.families import _vendored
from checks.infer.rules import pillar_of
from checks.infer.sources import _digest, _slug

MANIFESTS = ("setup.cfg", "pyproject.toml", "setup.py")
_TARGET = re.compile(r"=\s*[\"']?(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<obj>[A-Za-z_]\w*)")
_ROOTS = ("", "src/", "python/")  # where a package's top directory sits, from its manifest's directory

# module-level names: defs and classes (decorated or not), assignments and imports, also inside a top-level if/try
_BINDERS = [
    "(function_definition name: (identifier) @key)",
    "(decorated_definition definition: (function_definition name: (identifier) @key))",
    "(class_definition name: (identifier) @key)",
    "(decorated_definition definition: (class_definition name: (identifier) @key))",
    "(expression_statement (assignment left: (identifier) @key))",
    "(import_from_statement name: (dotted_name . (identifier) @key .))",
    "(import_from_statement name: (aliased_import alias: (identifier) @key))",
    "(import_statement name: (dotted_name . (identifier) @key))",
    "(import_statement name: (aliased_import alias: (identifier) @key))",
]
_BLOCKS = ("(if_statement (block {}))", "(if_statement (else_clause (block {})))", "(try_statement (block {}))",
           "(try_statement (except_clause (block {})))", "(try_statement (else_clause (block {})))")
DEFINED_QUERY = "\n".join([f"(module {b})" for b in _BINDERS] + [f"(module {k.format(b)})" for k in _BLOCKS
                                                                   for b in _BINDERS])


#: the key of a module's names: ``pkg.mod:name`` (checks/infer/explain.py words a missing one as its module's)
MODULE_NAME = "{module}:{key}"


@dataclass
class EntryPoints:
    path: str  # the manifest
    root: str  # where its targets' packages sit ("", "src/", "server/", ...)
    targets: dict[str, int] = field(default_factory=dict)  # "pkg.mod:obj" → line

    @property
    def packages(self) -> tuple[str, ...]:
        """The top-level packages the targets live in."""
        return tuple(sorted({t.split(".", 1)[0].split(":", 1)[0] for t in self.targets}))


def manifests(tree) -> list[tuple[str, str, str]]:
    """(path, "manifest", blob) of the files entry points are declared in (vendored trees left out): part of
    inference's cache key, and what :func:`manifest_entry_points` reads."""
    out = []
    for path in tree.paths():
        if path.rsplit("/", 1)[-1] in MANIFESTS and not _vendored(path):
            blob = tree.blob_sha(path)
            if blob:
                out.append((path, "manifest", blob))
    return out


def manifest_entry_points(tree, files: list[tuple[str, str, str]]) -> list[EntryPoints]:
    """The entry points into the tree's own packages that the manifests ``files`` (from :func:`manifests`: at
    the top or a sub-project's, e.g. ``server/pyproject.toml``) declare, one candidate per manifest and package
    root. Whether each target is defined is the rule's own question: inference keeps a rule only where it holds
    at base, so a manifest naming one object its module lacks holds no belief."""
    paths = set(tree.paths())
    out: list[EntryPoints] = []
    for path, _, _ in files:
        data = tree.read(path)
        if not data:
            continue
        here = path[: len(path) - len(path.rsplit("/", 1)[-1])]  # the manifest's directory, "" or "server/"
        text = data.decode("utf-8", "replace")
        by_root: dict[str, EntryPoints] = {}
        for m in _TARGET.finditer(text):
            root = _module_root(m["module"], here, paths)
            if root is None:
                continue  # not a module of this tree: a dependency's, or not an entry point at all
            ep = by_root.setdefault(root, EntryPoints(path, root))
            ep.targets.setdefault(f"{m['module']}:{m['obj']}", text.count("\n", 0, m.start()) + 1)
        out += by_root.values()
    return out


def _module_root(module: str, here: str, paths: set[str]) -> str | None:
    """Where ``module``'s package sits, from the manifest's directory (None: no file of the tree is it)."""
    rel = module.replace(".", "/")
    for root in _ROOTS:
        if f"{here}{root}{rel}.py" in paths or f"{here}{root}{rel}/__init__.py" in paths:
            return here + root
    return None


def entry_point_rule(ep: EntryPoints, pillars: list[Pillar], severity: str = "warning") -> tuple[list[Fact], Rule, str]:
    """Facts and a same-set rule: every entry point ``ep.path`` declares (into its packages) names an object its
    module defines at module level (the modules may define more)."""
    pkgs = "|".join(re.escape(p) for p in ep.packages)
    declared = Fact(id=f"entry-points@{ep.path}", lang="regex", files=[ep.path],
                    regex=rf"=\s*[\"']?(?P<key>(?:{pkgs})(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*)")
    # a key is the module's dotted path from the tree's top: under src/ that path starts "src."
    strip = {"normalize": [f"strip-prefix:{ep.root.replace('/', '.')}"]} if ep.root else {}
    defined = Fact(id=f"module-names:{ep.root}{'+'.join(ep.packages)}", lang="python",
                   files=[f"{ep.root}{p}/**/*.py" for p in ep.packages] + [f"{ep.root}{p}.py" for p in ep.packages],
                   query=DEFINED_QUERY, options={"key": MODULE_NAME, **strip})
    n = len(ep.targets)
    first = min(ep.targets.values())
    examples = [f"e.g. {t} ({ep.path}:{line})" for t, line in list(ep.targets.items())[:3]]
    rule = Rule(
        id=f"inferred-entry-points-{_slug(ep.path)}-{_digest(declared.id, defined.id)}",
        kind="same-set",
        facts=[declared.id, defined.id],
        pillar=pillar_of(ep.path, pillars),
        severity=severity,
        message=f"inferred at base (support {n}): every entry point {ep.path} declares names an object its module "
                "defines",
        options={"extra_ok": [defined.id]},
        source="inferred",
        evidence=[f"support {n}: each of the {n} entry points of {ep.path} ({ep.path}:{first}) names a module-level "
                  "object of the tree", *examples],
    )
    line = f"{rule.id}: every entry point {ep.path} declares names an object its module defines ({n} entry points)"
    return [declared, defined], rule, line
