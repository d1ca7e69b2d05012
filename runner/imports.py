"""A static Python import graph over one git tree: which test files reach a changed module.

Built from the blobs of the head commit, never by importing anything: a test
may import torch, or code that does not even run. ``ast`` reads each file;
files it cannot parse (a syntax error in the PR) fall back to tree-sitter,
which still finds the import statements around the error.

Importing ``a.b.c`` runs ``a/__init__.py``, ``a/b/__init__.py`` and
``a/b/c.py``, so all three are edges. Modules resolve against the repo root,
the usual source roots (``src/``, ``python/``, ``lib/``) and the importing
file's own directory (pytest's rootdir-relative imports).
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

SOURCE_ROOTS = ("", "src/", "python/", "lib/")
PROJECT_FILES = ("setup.py", "pyproject.toml")  # a directory holding one is a project of its own


@dataclass(frozen=True)
class Import:
    module: str  # dotted name, absolute after resolving relative imports
    names: tuple[str, ...] = ()  # for "from module import names"
    run: bool = False  # named in a string a subprocess runs ("-m", "pkg.cli" or "-c", "import pkg")


_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def run_strings(tree: ast.AST) -> list[Import]:
    """Modules a file runs in a subprocess: ``[sys.executable, "-m", "bot.cli"]`` or ``-c`` code that imports.

    Tests that drive a CLI through a subprocess import nothing of it, yet run
    all of it; these strings are their edges. A dotted string counts only when
    the graph resolves it to a file of the tree.
    """
    return strings_run(_str_constants(tree))


def strings_run(values: Iterable[str]) -> list[Import]:
    """``run_strings`` over a file's string constants, already collected."""
    out: list[Import] = []
    for value in values:
        if len(value) > 20_000:
            continue
        if _DOTTED.fullmatch(value):
            out.append(Import(value, run=True))
        elif "import " in value:
            try:
                code = ast.parse(value)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            for inner in ast.walk(code):
                if isinstance(inner, ast.Import):
                    out.extend(Import(a.name, run=True) for a in inner.names)
                elif isinstance(inner, ast.ImportFrom) and inner.module and not inner.level:
                    out.append(Import(inner.module, run=True))
    return out


def _str_constants(tree: ast.AST) -> list[str]:
    """Every ``str`` constant, in ``ast.walk`` order (breadth first), without its two generator layers per node:
    this walk is most of the cost of reading a test file's imports."""
    out: list[str] = []
    todo = deque([tree])
    constant, node_type = ast.Constant, ast.AST
    while todo:
        node = todo.popleft()
        if node.__class__ is constant:
            if isinstance(node.value, str):
                out.append(node.value)
            continue  # a constant has no child nodes
        for name in node._fields:
            child = getattr(node, name, None)
            if isinstance(child, list):
                todo.extend(item for item in child if isinstance(item, node_type))
            elif isinstance(child, node_type):
                todo.append(child)
    return out


def module_names(path: str, roots: Iterable[str] = SOURCE_ROOTS) -> list[str]:
    """Dotted names ``path`` is importable as, one per source root it sits under."""
    p = PurePosixPath(path)
    if p.suffix != ".py":
        return []
    parts = list(p.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    names = []
    for root in roots:
        rparts = list(PurePosixPath(root).parts) if root else []
        if parts[: len(rparts)] == rparts and len(parts) > len(rparts):
            names.append(".".join(parts[len(rparts) :]))
    return names


def _package_of(path: str) -> list[str]:
    p = PurePosixPath(path)
    parts = list(p.parent.parts)
    return parts


def parse_imports(path: str, data: bytes) -> list[Import]:
    return _parse_imports(path, data)[0]


def _parse_imports(path: str, data: bytes) -> tuple[list[Import], bool]:
    """(the imports, whether ``ast`` parsed the file)."""
    try:
        tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _imports_tree_sitter(path, data), False
    return statement_imports(path, tree) + run_strings(tree), True


def statement_imports(path: str, tree: ast.Module) -> list[Import]:
    """The import statements of a parsed file, nested blocks included (``run_strings`` adds the rest)."""
    out: list[Import] = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            out.extend(Import(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(path, node.module, node.level)
            if base is not None:
                out.append(Import(base, tuple(a.name for a in node.names)))
    return out


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(body: list[ast.stmt]):
    """Every statement, nested blocks included, without descending into expressions (imports are statements)."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        for name in _BLOCKS:
            inner = getattr(node, name, None)
            if isinstance(inner, list):
                stack.extend(reversed(inner))


_CACHE: dict[tuple[str, str], tuple[Import, ...]] = {}
_CACHE_MAX = 50_000
_UNPARSED: set[tuple[str, str]] = set()  # (path, blob) that ``ast`` could not parse


def imports_of(path: str, blob: str | None, read: Callable[[str], bytes | None]) -> tuple[Import, ...]:
    """The imports of ``path``, cached by (path, blob sha): audit after audit shares most blobs."""
    if blob is not None and (path, blob) in _CACHE:
        return _CACHE[(path, blob)]
    data = read(path)
    if data is None:
        found: tuple[Import, ...] = ()
        remember_imports(path, blob, found, False)
        return found
    from runner.impact import analyse_into_caches  # one parse gives the imports and the module's table

    return analyse_into_caches(path, blob, data)[1]


def remember_imports(path: str, blob: str | None, found: tuple[Import, ...], parsed: bool) -> None:
    if blob is None:
        return
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
        _UNPARSED.clear()
    _CACHE[(path, blob)] = found
    if not parsed:
        _UNPARSED.add((path, blob))


def parses(path: str, blob: str | None, read: Callable[[str], bytes | None]) -> bool:
    """Whether ``ast`` parses the file (False when that is not known: no blob sha to cache by)."""
    if blob is None:
        return False
    imports_of(path, blob, read)
    return (path, blob) not in _UNPARSED


def _absolute(path: str, module: str | None, level: int) -> str | None:
    if not level:
        return module
    pkg = _package_of(path)
    if level - 1 > len(pkg):
        return None
    base = pkg[: len(pkg) - (level - 1)]
    parts = base + (module.split(".") if module else [])
    return ".".join(parts) if parts else None


def _imports_tree_sitter(path: str, data: bytes) -> list[Import]:
    from checks.syntax import parse, text

    tree = parse("python", data)
    out: list[Import] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "import_statement":
            for child in node.named_children:
                target = child.child_by_field_name("name") if child.type == "aliased_import" else child
                if target is not None and target.type == "dotted_name":
                    out.append(Import(text(target)))
        elif node.type == "import_from_statement":
            mod = node.child_by_field_name("module_name")
            if mod is not None:
                raw = text(mod)
                level = len(raw) - len(raw.lstrip("."))
                base = _absolute(path, raw.lstrip(".") or None, level)
                names = []
                for child in node.children_by_field_name("name"):
                    target = child.child_by_field_name("name") if child.type == "aliased_import" else child
                    if target is not None:
                        names.append(text(target))
                if base:
                    out.append(Import(base, tuple(names)))
        stack.extend(node.children)
    return out


def _package_dirs(build: bytes, sub: str, paths: set[str]) -> list[tuple[str, str]]:
    """(package, its directory with a trailing slash) from a build file's ``package_dir={"pkg": "python"}`` or
    ``[tool.setuptools.package-dir] pkg = "python"``, for directories of ``sub`` that hold an ``__init__.py``;
    the longest directory first."""
    out = []
    for name, directory in re.findall(rb"[\"']?([A-Za-z_][\w.]*)[\"']?\s*[:=]\s*[\"']([\w./-]+)[\"']", build):
        d = directory.decode().strip("/")
        if d and f"{sub}{d}/__init__.py" in paths:
            out.append((name.decode(), f"{sub}{d}/"))
    return sorted(set(out), key=lambda pd: len(pd[1]), reverse=True)


@dataclass
class ImportGraph:
    """Lazily parsed: only the files reachable from the tests asked about are read."""

    paths: Iterable[str]
    read: Callable[[str], bytes | None]
    extra_paths: Iterable[str] = ()  # modules gone from the tree (deleted) that imports may still name
    blob_sha: Callable[[str], str | None] | None = None  # enables the parse cache
    _index: dict[str, str] = field(default_factory=dict, init=False)
    _edges: dict[str, list[str]] = field(default_factory=dict, init=False)
    _tops: set[str] | None = field(default=None, init=False)
    _needs: dict = field(default_factory=dict, init=False)  # (path, extensions) → _FileNeed, for gpu_need
    _dirs: dict[str, list[str]] = field(default_factory=dict, init=False)

    def _local_dir(self, importer: str) -> list[str]:
        """The importer's directory as parts (pytest's rootdir-relative imports resolve there)."""
        got = self._dirs.get(importer)
        if got is None:
            got = self._dirs[importer] = importer.split("/")[:-1]
        return got

    def __post_init__(self) -> None:
        self.paths = set(self.paths)
        every = sorted(set(self.paths) | set(self.extra_paths))
        for path in every:
            for name in module_names(path):
                self._index.setdefault(name, path)
        # a sub-project (``sub/setup.py`` beside ``sub/sub_pkg/``, no ``sub/__init__.py``) installs its packages
        # as top-level names too; the tree's own roots keep a name both give
        subs = sorted({p.split("/", 1)[0] + "/" for p in self.paths if p.count("/") == 1
                       and p.rsplit("/", 1)[1] in PROJECT_FILES and f"{p.split('/', 1)[0]}/__init__.py" not in self.paths})
        for sub in subs:
            # only the packages its build files name (``packages=["pkg"]``, ``include = "pkg"``): a sub-project's
            # ``utils/`` is not what ``import utils`` elsewhere in the tree means
            build = b"\n".join(self.read(sub + f) or b"" for f in PROJECT_FILES if sub + f in self.paths)
            declared = {m.decode() for m in re.findall(rb"[\"']([A-Za-z_]\w*)[\"'.*]", build)}
            roots = [sub + r for r in SOURCE_ROOTS]
            mapped = _package_dirs(build, sub, self.paths)
            for path in every:
                if path.startswith(sub):
                    for name in module_names(path, roots):
                        if name.split(".", 1)[0] in declared:
                            self._index.setdefault(name, path)
                    for package, directory in mapped:  # package_dir={"pkg": "python"}
                        if path.startswith(directory) and path.endswith(".py"):
                            rest = path[len(directory):].removesuffix(".py").removesuffix("__init__").strip("/")
                            self._index.setdefault(".".join([package, *filter(None, rest.split("/"))]), path)

    def conftests(self, path: str) -> list[str]:
        """conftest.py files pytest loads for a test file: its directory's and every parent's."""
        name = PurePosixPath(path).name
        if not (name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"):
            return []
        out = []
        for parent in PurePosixPath(path).parents:
            candidate = str(parent / "conftest.py") if str(parent) != "." else "conftest.py"
            if candidate != path and candidate in self.paths:
                out.append(candidate)
        return out

    def resolve(self, name: str, importer: str) -> list[str]:
        """Files executed by importing ``name`` from ``importer``: the module and its packages."""
        out: list[str] = []
        parts = name.split(".")
        local_dir = self._local_dir(importer)
        for i in range(1, len(parts) + 1):
            dotted = ".".join(parts[:i])
            hit = self._index.get(dotted)
            if hit is None and local_dir:
                hit = self._index.get(".".join(local_dir + parts[:i]))
            if hit is not None and hit not in out:
                out.append(hit)
        return out

    def top_packages(self) -> set[str]:
        if self._tops is None:
            self._tops = {name.split(".", 1)[0] for name in self._index}
        return self._tops

    def extension(self, imp: Import, importer: str, declared: frozenset[str] = frozenset()) -> str | None:
        """The compiled module ``imp`` loads, when it is one: below a package of the tree, no ``.py`` there."""
        from runner.runnable import EXTENSION_NAME

        candidates = [imp.module] + [f"{imp.module}.{n}" for n in imp.names if n != "*"]
        top = imp.module.split(".", 1)[0]
        if top in declared and self.module_file(top, importer) is None:
            return top
        if top not in self.top_packages() and self.module_file(imp.module, importer) is None:
            return None  # a third-party module
        for name in candidates:
            if self.module_file(name, importer) is not None:
                continue
            leaf = name.rsplit(".", 1)[-1]
            is_module = name == imp.module
            if not is_module and self._binds(imp.module, importer, leaf):
                continue  # "from pkg.engine import register_cuda_postproc": a function the module defines
            if (is_module and self.module_file(name.rsplit(".", 1)[0], importer) is not None) \
                    or leaf in declared or EXTENSION_NAME.search(leaf):
                return name
        return None

    def _binds(self, module: str, importer: str, name: str) -> bool:
        """Whether the tree's ``module`` itself defines ``name`` (so ``from module import name`` is no submodule):
        a plain module's names are all its own; a package's ``__init__`` binds a name it defines, assigns or
        imports from another module (``from .lower import name``), not one it imports as its submodule."""
        path = self.module_file(module, importer)
        if path is None:
            return False
        if not path.endswith("__init__.py"):
            return True
        data = self.read(path) or b""
        if re.search(rb"(?m)^\s*(?:(?:async\s+)?def|class)\s+%s\b|^\s*%s\s*[:=]" % (re.escape(name.encode()),
                                                                                re.escape(name.encode())), data):
            return True
        blob = self.blob_sha(path) if self.blob_sha else None
        for imp in imports_of(path, blob, self.read):
            if name in imp.names and not imp.run:
                source = self.module_file(imp.module, path)
                if source is not None and source != path:
                    return True
        return False

    def module_file(self, name: str, importer: str) -> str | None:
        """The file that ``name`` itself is (its ``__init__.py`` for a package), or None."""
        hit = self._index.get(name)
        local_dir = self._local_dir(importer)
        if hit is None and local_dir:
            hit = self._index.get(".".join(local_dir + name.split(".")))
        return hit

    def edges(self, path: str) -> list[str]:
        if path not in self._edges:
            targets: list[str] = []
            blob = self.blob_sha(path) if self.blob_sha else None
            for imp in imports_of(path, blob, self.read):
                if imp.run and self.module_file(imp.module, path) is None:
                    continue  # a dotted string that is no module of the tree
                found = self.resolve(imp.module, path)
                for name in imp.names:  # "from pkg import mod" imports pkg/mod.py
                    if name != "*":
                        found += self.resolve(f"{imp.module}.{name}", path)
                targets += [t for t in found if t != path and t not in targets]
            targets += [c for c in self.conftests(path) if c not in targets]
            self._edges[path] = targets
        return self._edges[path]

    def chain_to(self, start: str, targets: set[str]) -> list[str] | None:
        """Shortest import chain from ``start`` to any of ``targets`` (inclusive), or None."""
        if start in targets:
            return [start]
        parent: dict[str, str | None] = {start: None}
        queue = deque([start])
        while queue:
            cur = queue.popleft()
            for nxt in self.edges(cur):
                if nxt in parent:
                    continue
                parent[nxt] = cur
                if nxt in targets:
                    chain = [nxt]
                    while parent[chain[-1]] is not None:
                        chain.append(parent[chain[-1]])  # type: ignore[arg-type]
                    return chain[::-1]
                if nxt.endswith(".py"):
                    queue.append(nxt)
        return None


# --------------------------------------------------------------------------- what a test needs to run

# Importing any of these means the test runs its code on a GPU (triton: unless run by its interpreter).
GPU_MODULES = ("torch.cuda", "triton", "cupy", "pycuda", "cuda", "numba.cuda", "cutlass", "tilelang", "tensorrt",
               "flash_attn", "nvidia")
_CUDA_USE = re.compile(rb"\btorch\.cuda\.(?!is_available|device_count)|\.cuda\(\)|device\s*=\s*['\"]cuda|['\"]cuda:\d['\"]")
# A test that asks whether CUDA is there runs on a CPU machine too (skipping or taking a CPU path).
_CUDA_GUARD = re.compile(rb"\bcuda\.is_available\(|\bcuda\.device_count\(")


def _gpu_module(imp: Import) -> str | None:
    full = [imp.module] + [f"{imp.module}.{n}" for n in imp.names]
    for name in full:
        for gpu in GPU_MODULES:
            if name == gpu or name.startswith(gpu + "."):
                return name
    return None


@dataclass(frozen=True)
class _FileNeed:
    """What one file's own imports say about the GPU (the closure is the union over files)."""

    hard: str | None  # a GPU module or a compiled extension
    triton: str | None
    missing: str | None  # a module of a tree package with no .py (generated or built at install)
    interprets: bool  # mentions TRITON_INTERPRET


def _file_need(graph: ImportGraph, path: str, extensions: frozenset[str]) -> _FileNeed:
    from runner.runnable import EXTENSION_NAME

    key = (path, extensions)
    if key in graph._needs:
        return graph._needs[key]
    blob = graph.blob_sha(path) if graph.blob_sha else None
    hard = triton = missing = None
    for imp in imports_of(path, blob, graph.read):
        gpu = _gpu_module(imp)
        if gpu is not None:
            if gpu.split(".", 1)[0] != "triton":
                hard = hard or f"{path} imports {gpu}"
            triton = triton or f"{path} imports {gpu}"
            continue
        ext = None if imp.run else graph.extension(imp, path, extensions)
        if ext is None:
            continue
        leaf = ext.rsplit(".", 1)[-1]
        if leaf in extensions or EXTENSION_NAME.search(leaf):
            hard = hard or f"{path} imports {ext}, a compiled extension"
        else:
            missing = missing or f"{path} imports {ext}, which the tree has no .py for (built at install?)"
    need = _FileNeed(hard, triton, missing, b"TRITON_INTERPRET" in (graph.read(path) or b""))
    graph._needs[key] = need
    return need


def gpu_need(graph: ImportGraph, test_file: str, extensions: frozenset[str] = frozenset()) -> str | None:
    """Why ``test_file`` needs a GPU, from the imports of everything it reaches; None when it does not.

    A compiled extension of the repo counts (an import below one of the tree's
    packages that is no ``.py`` there, or a module the build files declare),
    since it only exists where it was built for the GPU. ``triton`` alone does
    not count when something on the way sets ``TRITON_INTERPRET``.
    """
    own = graph.read(test_file) or b""
    if _CUDA_USE.search(own) and not _CUDA_GUARD.search(own):
        return f"{test_file} uses CUDA tensors"
    seen = {test_file}
    queue = deque([test_file])
    triton_via = missing_via = None
    interpreted = False
    while queue:
        cur = queue.popleft()
        need = _file_need(graph, cur, extensions)
        if need.hard:
            return need.hard
        triton_via = triton_via or need.triton
        missing_via = missing_via or need.missing
        interpreted = interpreted or need.interprets
        for nxt in graph.edges(cur):
            if nxt not in seen and nxt.endswith(".py"):
                seen.add(nxt)
                queue.append(nxt)
    return missing_via or (None if interpreted else triton_via)
