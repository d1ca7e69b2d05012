"""Calls fit their callee: a PR leaves no call of one of the tree's Python functions passing what it no longer takes.

A signature change whose callers in other files were not updated (a parameter added in front, one removed, a
constructor that now takes the type first) is drift a review should name before the code runs. The check needs
no config: it reads the PR's Python files at base and head, and judges

- every call the PR writes or edits (an added line inside it, or call text the base's file lacks), and
- every call, anywhere in the tree, of a module-level function or class whose parameters the PR changes
  (``super().__init__`` of a subclass with that one base included),

each resolved by name to one module-level ``def`` or ``class`` of the tree (the caller's own module, a
``from … import`` (relative ones too, followed through a package's re-exports) or a module alias ``m.f(...)``).
A call whose positional and keyword arguments cannot bind to the callee's parameters at head is reported, unless
the same call (or, for an edited one, the calls of that function from the same function) did not fit at base
either: that misfit is the code's own, not the PR's.

Quiet by construction: a callee counts only bound once in its module, undecorated or behind decorators that keep
its signature (a known list, or the tree's own built on ``functools.wraps``); a class only with its own
undecorated ``__init__`` (and ``__new__``, which a call must fit too) and no metaclass; a call with
``*args``/``**kwargs`` is never judged, nor one whose name a parameter, assignment or nested definition of an
enclosing function shadows. Method calls are not resolved. Vendored, test, example and benchmark trees are left
out, as for the other inferred checks.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import tree_sitter as ts

from checks import syntax
from checks.expr import clip
from checks.infer.families import MAX_BYTES, _vendored
from checks.model import ChangeSet, Finding, Location

RULE_ID = "inferred-call-fit"
MAX_CALLERS = 2000  # files read for the callers of the signatures a PR changes
MAX_CHANGED = 500  # changed signatures followed per audit

_SCOPES = ("function_definition", "lambda")
_BLOCKS = ("if_statement", "try_statement", "with_statement", "for_statement", "while_statement", "block",
           "elif_clause", "else_clause", "except_clause", "finally_clause", "expression_statement",
           "match_statement", "case_clause")


# decorators that hand back a callable taking what the function takes
_KEEPS_SIGNATURE = re.compile(
    r"^(staticmethod|(functools\.)?(lru_cache|cache)(\(.*\))?|(contextlib\.)?(async)?contextmanager"
    r"|torch\.(no_grad|inference_mode|compile|jit\.(script|ignore|unused)|compiler\.disable|_dynamo\.disable)"
    r"(\(.*\))?|(typing\.)?(final|override))$", re.S)
_DOTTED = re.compile(r"^([A-Za-z_][\w.]*)(\(.*\))?$", re.S)
_WRAPS = re.compile(r"^@\s*(functools\.)?wraps\s*\(")


def _decorators(node: ts.Node) -> tuple[str, ...] | None:
    """The decorators that may change what the function takes, as the dotted names to look up (a call's callee:
    ``@guard(dtype)`` → ``guard``); None where one is no plain name (nothing to look up)."""
    if node.type != "decorated_definition":
        return ()
    out = []
    for d in node.named_children:
        if d.type != "decorator":
            continue
        text = " ".join(syntax.text(d).lstrip("@").split())
        if _KEEPS_SIGNATURE.match(text):
            continue
        m = _DOTTED.match(text)
        if m is None:
            return None
        out.append(m.group(1))
    return tuple(out)


def _keeps_signature(node: ts.Node) -> bool:
    """An undecorated definition, or one whose decorators are all known to keep its signature."""
    return _decorators(node) == ()


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "pos" (before /), "any", "kw" (after * or *args), "star" (*args), "starstar" (**kwargs)
    default: bool


@dataclass(frozen=True)
class Sig:
    """What one callable takes: its parameters, ``self``/``cls`` dropped for a class's ``__init__``/``__new__``."""

    path: str
    name: str
    line: int
    params: tuple[Param, ...]
    text: str  # the parameter list as written, for the message
    label: str = ""  # how the message names it: the function, or ``Class.__init__``

    def render(self) -> str:
        """The parameters without annotations or default values: ``(x, weight, /, *args, eps=…, **kw)``."""
        parts: list[str] = []
        for i, p in enumerate(self.params):
            if p.kind == "kw" and not any(q.kind in ("star", "kw") for q in self.params[:i]):
                parts.append("*")
            parts.append("*" + p.name if p.kind == "star" else "**" + p.name if p.kind == "starstar"
                         else p.name + "=…" if p.default else p.name)
            if p.kind == "pos" and (i + 1 == len(self.params) or self.params[i + 1].kind != "pos"):
                parts.append("/")
        return "(" + ", ".join(parts) + ")"

    def misfit(self, npos: int, keywords: tuple[str, ...]) -> str | None:
        """Why ``npos`` positional arguments and these keywords cannot bind, or None."""
        positional = [p for p in self.params if p.kind in ("pos", "any")]
        star = any(p.kind == "star" for p in self.params)
        starstar = any(p.kind == "starstar" for p in self.params)
        if npos > len(positional) and not star:
            return f"takes at most {len(positional)} positional argument{'s' * (len(positional) != 1)}, the call " \
                   f"passes {npos}"
        bound = {p.name for p in positional[:npos]}
        named = {p.name: p for p in self.params if p.kind in ("any", "kw")}
        for k in keywords:
            if k in named:
                if k in bound:
                    return f"gets `{k}` both by position and by keyword"
                bound.add(k)
            elif not starstar:  # a positional-only name given by keyword lands in **kwargs, if any
                return f"has no parameter `{k}`"
        missing = [p.name for p in self.params if p.kind in ("pos", "any", "kw") and not p.default and p.name not in bound]
        if missing:
            return "needs " + ", ".join(f"`{m}`" for m in missing) + ", which the call does not pass"
        return None


@dataclass
class Module:
    """One file's module-level callables and the names it imports."""

    path: str
    callables: dict[str, Sig] = field(default_factory=dict)
    bound: dict[str, int] = field(default_factory=dict)  # module-level bindings per name
    imports: dict[str, tuple[str, str] | None] = field(default_factory=dict)  # local → (module text, name); None: ambiguous
    modules: dict[str, str | None] = field(default_factory=dict)  # local → module text ("import a.b as m")
    defs: set[str] = field(default_factory=set)  # module-level functions, however decorated
    wrapping: set[str] = field(default_factory=set)  # of those, decorators built on functools.wraps
    pending: dict[str, tuple[Sig, tuple[str, ...]]] = field(default_factory=dict)  # callables behind such decorators
    root: ts.Node | None = None


# --------------------------------------------------------------------------- reading a module


def _params(node: ts.Node, drop_first: bool) -> tuple[Param, ...] | None:
    out: list[Param] = []
    after_star = False
    for ch in node.named_children:
        t = ch.type
        if t == "comment":
            continue
        inner = ch.named_children[0] if t == "typed_parameter" and ch.named_children else ch
        if inner.type == "list_splat_pattern":
            out.append(Param(syntax.text(inner).lstrip("*"), "star", True))
            after_star = True
        elif inner.type == "dictionary_splat_pattern":
            out.append(Param(syntax.text(inner).lstrip("*"), "starstar", True))
        elif t == "keyword_separator":
            after_star = True
        elif t == "positional_separator":
            out = [Param(p.name, "pos", p.default) if p.kind == "any" else p for p in out]
        elif t in ("identifier", "typed_parameter"):
            out.append(Param(syntax.text(inner), "kw" if after_star else "any", False))
        elif t in ("default_parameter", "typed_default_parameter"):
            name = ch.child_by_field_name("name")
            if name is None:
                return None
            out.append(Param(syntax.text(name), "kw" if after_star else "any", True))
        else:
            return None  # a tuple parameter (Python 2) or an error: no signature to trust
    if drop_first:
        if not out or out[0].kind not in ("pos", "any"):
            return None
        out = out[1:]
    return tuple(out)


def _sig(path: str, name: str, fn: ts.Node, method: str = "") -> Sig | None:
    params = fn.child_by_field_name("parameters")
    if params is None:
        return None
    got = _params(params, bool(method))
    if got is None:
        return None
    return Sig(path, name, fn.start_point[0] + 1, got, " ".join(syntax.text(params).split()),
               f"{name}.{method}" if method else name)


def _class_sigs(path: str, name: str, cls: ts.Node) -> dict[str, Sig] | None:
    """The class's own ``__init__`` and ``__new__`` (None: no own ``__init__``, a decorated one, or a metaclass)."""
    supers = cls.child_by_field_name("superclasses")
    if supers is not None and any(c.type == "keyword_argument" for c in supers.named_children):
        return None
    body = cls.child_by_field_name("body")
    if body is None:
        return None
    sigs: dict[str, Sig | None] = {}
    for ch in body.named_children:
        fn = ch.child_by_field_name("definition") if ch.type == "decorated_definition" else ch
        if fn is None or fn.type != "function_definition":
            continue
        n = fn.child_by_field_name("name")
        meth = syntax.text(n) if n is not None else ""
        if meth in ("__init__", "__new__"):
            sigs[meth] = None if not _keeps_signature(ch) or meth in sigs else _sig(path, name, fn, meth)
    if "__init__" not in sigs or any(s is None for s in sigs.values()):
        return None
    return {m: s for m, s in sigs.items() if s is not None}


def _module_def(mod: Module, name: str, fn: ts.Node) -> None:
    mod.defs.add(name)
    body = fn.child_by_field_name("body")
    if body is not None and b"wraps" in (body.text or b"") and any(
            _WRAPS.match(syntax.text(d)) for d in _captured(body, "(decorator)")):
        mod.wrapping.add(name)


def _targets(node: ts.Node) -> Iterator[str]:
    if node.type == "identifier":
        yield syntax.text(node)
    elif node.type in ("pattern_list", "tuple_pattern", "list_pattern", "tuple", "list", "parenthesized_expression"):
        for ch in node.named_children:
            yield from _targets(ch)


def _bindings(node: ts.Node, mod: Module, classes: dict[str, dict[str, Sig] | None]) -> None:
    """Count module-level bindings (through if/try/with/for blocks, not into defs and classes)."""
    for ch in node.named_children:
        t = ch.type
        if t == "decorated_definition":
            d = ch.child_by_field_name("definition")
            n = d.child_by_field_name("name") if d is not None else None
            if d is None or n is None:
                continue
            name = syntax.text(n)
            mod.bound[name] = mod.bound.get(name, 0) + 1
            if d.type == "function_definition":
                _module_def(mod, name, d)
                decos = _decorators(ch)
                s = _sig(mod.path, name, d) if decos is not None else None
                if s is not None and decos:
                    mod.pending[name] = (s, decos)  # kept if each decorator is built on functools.wraps
                elif s is not None:
                    mod.callables[name] = s
            # a decorated class (dataclass, a registry's decorator) may get or wrap its __init__: not read
        elif t in ("function_definition", "class_definition"):
            n = ch.child_by_field_name("name")
            if n is None:
                continue
            name = syntax.text(n)
            mod.bound[name] = mod.bound.get(name, 0) + 1
            # module level, also inside an if or try block (a version gate): _bindings enters no def or class
            if t == "function_definition":
                _module_def(mod, name, ch)
                s = _sig(mod.path, name, ch)
                if s is not None:
                    mod.callables[name] = s
            else:
                classes[name] = _class_sigs(mod.path, name, ch)
        elif t in ("assignment", "augmented_assignment"):
            left = ch.child_by_field_name("left")
            for name in _targets(left) if left is not None else ():
                mod.bound[name] = mod.bound.get(name, 0) + 1
        elif t in ("import_statement", "import_from_statement"):
            for name, _, _ in _imported(ch):
                mod.bound[name] = mod.bound.get(name, 0) + 1
        elif t == "for_statement":
            left = ch.child_by_field_name("left")
            for name in _targets(left) if left is not None else ():
                mod.bound[name] = mod.bound.get(name, 0) + 1
            _bindings(ch, mod, classes)
        elif t in _BLOCKS:
            _bindings(ch, mod, classes)


def _imported(node: ts.Node) -> Iterator[tuple[str, tuple[str, str] | None, str | None]]:
    """What an import statement binds: (local name, (module text, name) for ``from … import``, the dotted module
    for ``import a.b [as m]``). ``import a.b`` binds ``a``, through which ``a.b.f`` is reached."""
    if node.type == "import_from_statement":
        m = node.child_by_field_name("module_name")
        for nm in node.children_by_field_name("name"):
            orig = nm.child_by_field_name("name") if nm.type == "aliased_import" else nm
            alias = nm.child_by_field_name("alias") if nm.type == "aliased_import" else None
            if orig is not None and m is not None:
                local = syntax.text(alias) if alias is not None else syntax.text(orig).rsplit(".", 1)[-1]
                yield local, (syntax.text(m), syntax.text(orig)), None
    elif node.type == "import_statement":
        for nm in node.children_by_field_name("name"):
            if nm.type == "aliased_import":
                orig, alias = nm.child_by_field_name("name"), nm.child_by_field_name("alias")
                if orig is not None and alias is not None:
                    yield syntax.text(alias), None, syntax.text(orig)
            else:
                top = syntax.text(nm).split(".", 1)[0]
                yield top, None, top


_QUERIES: dict[str, ts.Query] = {}


def _captured(node: ts.Node, pattern: str) -> list[ts.Node]:
    """The nodes under ``node`` that ``(pattern) @n`` captures, in source order (tree-sitter's own walk: far
    cheaper than one in Python over every node)."""
    q = _QUERIES.get(pattern)
    if q is None:
        q = _QUERIES[pattern] = ts.Query(syntax.language("python"), f"{pattern} @n")
    got = ts.QueryCursor(q).captures(node).get("n", [])
    return sorted(got, key=lambda n: n.start_byte)


def _walk(node: ts.Node) -> Iterator[ts.Node]:
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.named_children))


def read_module(path: str, data: bytes | None, blob: str | None = None) -> Module | None:
    if data is None or len(data) > MAX_BYTES or b"\0" in data[:8192]:
        return None
    mod = Module(path)
    root = syntax.parse("python", data, blob).root_node  # by blob: the trees other stages parsed are shared
    mod.root = root
    classes: dict[str, dict[str, Sig] | None] = {}
    _bindings(root, mod, classes)
    for name in [n for n in mod.callables if mod.bound.get(n, 0) != 1]:
        del mod.callables[name]
    for name in [n for n in mod.pending if mod.bound.get(n, 0) != 1]:
        del mod.pending[name]
    for name, sigs in classes.items():
        if sigs and mod.bound.get(name, 0) == 1:
            mod.callables[name] = sigs["__init__"]
            if "__new__" in sigs:  # a class call must fit both
                mod.callables[name + ".__new__"] = sigs["__new__"]
    for n in _captured(root, "[(import_from_statement) (import_statement)]"):  # function-level ones included
        for local, target, dotted in _imported(n):
            if target is not None:
                mod.imports[local] = target if mod.imports.get(local, target) == target else None
            else:
                mod.modules[local] = dotted if mod.modules.get(local, dotted) == dotted else None
    return mod


# --------------------------------------------------------------------------- resolving names


class Resolver:
    """Modules of one tree by path, read once; import texts resolved to files of that tree."""

    def __init__(self, tree) -> None:
        self.tree = tree
        self.paths = set(tree.paths())
        self._mods: dict[str, Module | None] = {}
        self._data: dict[str, bytes] = {}  # blob → bytes, read ahead in one batch

    def prefetch(self, paths) -> None:
        """Read these files' blobs in one ``git cat-file --batch`` (a round trip per blob costs more)."""
        from checks.facts import read_blobs

        blobs = [b for p in paths if p in self.paths and (b := self.tree.blob_sha(p)) and b not in self._data]
        if blobs:
            self._data.update(read_blobs(str(self.tree.repo_path), blobs))

    def module(self, path: str) -> Module | None:
        if path not in self._mods:
            try:
                blob = self.tree.blob_sha(path) if path in self.paths else None
                data = (self._data.get(blob) or self.tree.read(path)) if blob else None
                self._mods[path] = read_module(path, data, blob) if blob else None
            except RecursionError:  # nesting past Python's stack: that file is not read, the others are
                self._mods[path] = None
        return self._mods[path]

    def module_file(self, importer: str, text: str) -> str | None:
        """The file an import's module text names, seen from ``importer`` (None: not a module of this tree)."""
        level = len(text) - len(text.lstrip("."))
        rel = text[level:].replace(".", "/")
        if level:
            base = posixpath.dirname(importer)
            for _ in range(level - 1):
                base = posixpath.dirname(base)
            roots = [base + "/" if base else ""]
        else:
            parts = importer.split("/")[:-1]
            roots = [""] + ["/".join(parts[:i]) + "/" for i in range(1, len(parts) + 1)]
            # a module importing its own package: the root that package sits in comes first (a sub-project's
            # copy of a package, KT-SFT/ktransformers beside ktransformers, means its own)
            top = rel.split("/", 1)[0]
            own = [i for i in range(len(parts)) if parts[i] == top]
            if own:
                root = "/".join(parts[:own[-1]]) + "/" if own[-1] else ""
                roots = [root] + [r for r in roots if r != root]
            elif parts and "/".join(parts) + "/__init__.py" not in self.paths:
                # a script's directory (no package): Python puts it first on the path
                here = "/".join(parts) + "/"
                roots = [here] + [r for r in roots if r != here]
        for root in roots:
            stem = (root + rel).rstrip("/")
            for cand in (stem + ".py", stem + "/__init__.py") if stem else ("__init__.py",):
                if cand in self.paths:
                    return cand
        return None

    def locate(self, path: str, name: str, hops: int = 3, caller: bool = True) -> tuple[str, str] | None:
        """(the module that defines ``name``, its name there), seen from module ``path``: its own, or through
        ``from … import`` (a package's re-exports too), or None. The caller's own imports may sit in a function
        (bound 0 times at module level); a re-export must be bound once."""
        mod = self.module(path)
        if mod is None:
            return None
        if name in mod.defs or name in mod.callables:
            return (path, name) if mod.bound.get(name, 0) == 1 else None
        got = mod.imports.get(name)
        if got is None or hops <= 0 or mod.bound.get(name, 0) > 1 or (not caller and mod.bound.get(name, 0) != 1):
            return None
        target = self.module_file(path, got[0])
        return self.locate(target, got[1], hops - 1, caller=False) if target is not None else None

    def callee(self, path: str, name: str) -> tuple[Sig, str] | None:
        """The signature of the callable ``name`` means in module ``path``, and the file that defines it."""
        loc = self.locate(path, name)
        mod = self.module(loc[0]) if loc is not None else None
        if loc is None or mod is None:
            return None
        if loc[1] in mod.callables:
            return mod.callables[loc[1]], loc[0]
        if loc[1] in mod.pending:
            sig, decos = mod.pending[loc[1]]
            for deco in decos:  # each one must be the tree's own, built on functools.wraps
                where = self._name(mod, deco)
                dmod = self.module(where[0]) if where is not None else None
                if where is None or dmod is None or where[1] not in dmod.wrapping:
                    return None
            return sig, loc[0]
        return None

    def _name(self, mod: Module, dotted: str) -> tuple[str, str] | None:
        """Where a dotted name of ``mod`` (``guard``, ``utils.guard``) is defined."""
        if "." not in dotted:
            return self.locate(mod.path, dotted)
        obj, _, attr = dotted.rpartition(".")
        target = self._module_of(mod, obj)
        return self.locate(target, attr) if target is not None else None

    def _module_of(self, mod: Module, text: str) -> str | None:
        """The file of the module a dotted object text of ``mod`` names (``m``, ``pkg.sub``), or None."""
        head = text.split(".", 1)[0]
        bound_as = mod.modules.get(head)
        if bound_as is not None and mod.bound.get(head, 0) <= 1:
            return self.module_file(mod.path, text if bound_as == head else bound_as + text[len(head):])
        got = mod.imports.get(text)
        if got is not None and mod.bound.get(text, 0) == 1:
            src, orig = got
            pkg = self.module_file(mod.path, src)
            sub = self.module_file(pkg, "." + orig) if pkg and pkg.endswith("__init__.py") else None
            if sub is not None:
                return sub
            # "from . import mod", or a package without __init__.py
            return self.module_file(mod.path, src + orig if src.endswith(".") else f"{src}.{orig}")
        return None

    def resolve_call(self, mod: Module, fn: ts.Node) -> tuple[Sig, str] | None:
        """The signature a call's function node names, and the file that defines it, or None."""
        if fn.type == "identifier":
            return self.callee(mod.path, syntax.text(fn))
        if fn.type == "attribute":
            obj, attr = fn.child_by_field_name("object"), fn.child_by_field_name("attribute")
            if obj is None or attr is None:
                return None
            if _is_super(obj) and syntax.text(attr) == "__init__":
                return self._base_class(mod, fn)
            if not re.fullmatch(r"[\w.]+", syntax.text(obj)):
                return None
            target = self._module_of(mod, syntax.text(obj))
            return self.callee(target, syntax.text(attr)) if target else None
        return None

    def _base_class(self, mod: Module, fn: ts.Node) -> tuple[Sig, str] | None:
        """``super().__init__`` in the undecorated ``__init__`` of a class with one plain base: that base, as a call
        names it. (In a classmethod, ``super().__init__`` is the unbound function and takes ``self`` itself.)"""
        method = fn.parent
        while method is not None and method.type != "function_definition":
            method = method.parent
        name = method.child_by_field_name("name") if method is not None else None
        if name is None or syntax.text(name) != "__init__":
            return None
        body = method.parent if method is not None else None
        cls = body.parent if body is not None and body.type == "block" else None
        if cls is None or cls.type != "class_definition":
            return None
        supers = cls.child_by_field_name("superclasses")
        bases = [b for b in supers.named_children if b.type != "comment"] if supers is not None else []
        if len(bases) != 1 or bases[0].type not in ("identifier", "attribute"):
            return None
        return self.resolve_call(mod, bases[0])


# --------------------------------------------------------------------------- calls


@dataclass(frozen=True)
class Call:
    path: str
    line: int
    func: str  # the function as written
    npos: int
    keywords: tuple[str, ...]
    key: bytes  # the call's source without whitespace: its identity across base and head
    end_line: int = 0
    node: ts.Node | None = field(default=None, compare=False, repr=False)

    @property
    def text(self) -> str:
        """The call as written, whitespace collapsed (what the message quotes)."""
        raw = " ".join(syntax.text(self.node).split()) if self.node is not None else self.key.decode("utf-8", "replace")
        return re.sub(r",?\s+\)", ")", re.sub(r"\(\s+", "(", raw))


def _shadowed(node: ts.Node, name: str) -> bool:
    """A parameter, assignment, loop or ``with`` target of an enclosing function binds ``name`` locally."""
    p = node.parent
    while p is not None:
        if p.type in _SCOPES:
            params = p.child_by_field_name("parameters")
            if params is not None and any(
                    syntax.text(n) == name for n in _walk(params) if n.type == "identifier"):
                return True
            body = p.child_by_field_name("body")
            for n in _walk(body) if body is not None else ():
                if n.type in ("assignment", "augmented_assignment", "for_statement", "for_in_clause"):
                    left = n.child_by_field_name("left")
                    if left is not None and name in set(_targets(left)):
                        return True
                elif n.type == "as_pattern_target" and syntax.text(n) == name:
                    return True
                elif n.type in ("function_definition", "class_definition") and n is not p:
                    nm = n.child_by_field_name("name")
                    if nm is not None and syntax.text(nm) == name:
                        return True
        p = p.parent
    return False


_WS = re.compile(rb"\s+")


def calls_in(mod: Module, lines: set[int] | None = None, names: set[str] | None = None
             ) -> Iterator[tuple[Call, ts.Node]]:
    """The calls of ``mod`` with plain arguments (on ``lines`` only, of functions whose last name is one of
    ``names`` only, when given), and each one's function node."""
    if mod.root is None:
        return
    for n in _captured(mod.root, "(call)"):
        line, end = n.start_point[0] + 1, n.end_point[0] + 1
        if lines is not None and not any(ln in lines for ln in range(line, end + 1)):
            continue
        fn, args = n.child_by_field_name("function"), n.child_by_field_name("arguments")
        if fn is None or args is None or n.has_error:
            continue
        if names is not None and (fn.text or b"").rsplit(b".", 1)[-1].decode("utf-8", "replace") not in names:
            continue
        kws: tuple[str, ...] = ()
        if args.type == "generator_expression":
            npos = 1
        else:
            npos, kw, splat = 0, [], False
            for a in args.named_children:
                if a.type == "comment":
                    continue
                if a.type == "keyword_argument":
                    k = a.child_by_field_name("name")
                    kw.append(syntax.text(k) if k is not None else "")
                elif a.type in ("list_splat", "dictionary_splat"):
                    splat = True
                else:
                    npos += 1
            if splat or kw.count("") or len(set(kw)) != len(kw):
                continue
            kws = tuple(kw)
        if fn.type not in ("identifier", "attribute"):
            continue
        yield Call(mod.path, line, syntax.text(fn), npos, kws, _WS.sub(b"", n.text or b""), end, n), fn


def _scope(node: ts.Node) -> str:
    names = []
    p = node.parent
    while p is not None:
        if p.type in ("function_definition", "class_definition"):
            nm = p.child_by_field_name("name")
            names.append(syntax.text(nm) if nm is not None else "?")
        p = p.parent
    return ".".join(reversed(names))


def _is_super(node: ts.Node) -> bool:
    """``super()`` with no arguments. ``super(Cls, self)`` starts the lookup after ``Cls``, which may skip the base
    (a subclass calling past its parent's ``__init__``): not read."""
    f = node.child_by_field_name("function") if node.type == "call" else None
    args = node.child_by_field_name("arguments") if node.type == "call" else None
    return (f is not None and f.type == "identifier" and syntax.text(f) == "super" and args is not None
            and not [a for a in args.named_children if a.type != "comment"])


def _misfit(res: Resolver, got: tuple[Sig, str], call: Call) -> str | None:
    """Why the call cannot bind to its callee ``got`` (signature, file), or None where it fits. A class call binds
    to its ``__init__`` and ``__new__``; ``super().__init__(...)`` to the base's ``__init__`` alone."""
    sig, path = got
    why = sig.misfit(call.npos, call.keywords)
    if why is None and not call.func.endswith(".__init__"):
        mod = res.module(path)
        new = mod.callables.get(sig.name + ".__new__") if mod is not None else None
        why = new.misfit(call.npos, call.keywords) if new is not None else None
    return why


# --------------------------------------------------------------------------- the check


def _fits(res: Resolver, mod: Module, call: Call, fn: ts.Node) -> bool:
    """The call fitted its callee at base (an unresolvable callee there counts as not)."""
    got = res.resolve_call(mod, fn)
    return got is not None and _misfit(res, got, call) is None


def _by_key(mod: Module | None) -> dict[bytes, list[tuple[Call, ts.Node]]]:
    """A module's calls by their whitespace-free source."""
    out: dict[bytes, list[tuple[Call, ts.Node]]] = {}
    for c, f in calls_in(mod) if mod is not None else ():
        out.setdefault(c.key, []).append((c, f))
    return out


def _copied_misfit(base: Resolver, path: str, call: Call, most: int = 20) -> bool:
    """A file of the same name at base holds the same call, and it did not fit there either (a backend copied
    whole, its unused classes with it)."""
    name = posixpath.basename(path)
    for other in sorted(p for p in base.paths if posixpath.basename(p) == name and p != path)[:most]:
        mod = base.module(other)
        if mod is None:
            continue
        for c, f in calls_in(mod, names={call.func.rsplit(".", 1)[-1]}):
            if c.key == call.key and not _fits(base, mod, c, f):
                return True
    return False


def _git_grep(repo, sha: str, names: list[str]) -> list[str]:
    """The Python files of ``sha`` that hold any of ``names`` as a word."""
    patterns = [a for n in names for a in ("-e", n)]
    try:
        out = repo.git.grep("-l", "-w", "-F", *patterns, sha, "--", "*.py")
    except Exception:  # exit 1: no match
        return []
    prefix = f"{sha}:"
    return [line[len(prefix):] if line.startswith(prefix) else line for line in out.splitlines()]


def findings(repo_path: str, changes: ChangeSet, base_sha: str, head_sha: str, *,
             pillar_of: Callable[[str], str] = lambda p: "other", severity: str = "warning") -> list[Finding]:
    """The calls this PR leaves unfit for their callee (module docstring), one finding each."""
    from checks.workspace import Tree

    py = [fc for fc in changes.files if fc.path.endswith(".py") and fc.status != "deleted" and not fc.binary
          and not _vendored(fc.path)]
    if not py:
        return []
    head, base = Resolver(Tree(repo_path, head_sha)), Resolver(Tree(repo_path, base_sha))
    head.prefetch(fc.path for fc in py)
    base.prefetch(fc.old_path or fc.path for fc in py)
    changed: dict[tuple[str, str], Sig] = {}  # (path, name) at head → the signature at base
    for fc in py:
        h = head.module(fc.path)
        b = base.module(fc.old_path or fc.path) if fc.status != "added" else None
        if h is None or b is None:
            continue
        for name, sig in h.callables.items():
            old = b.callables.get(name)
            if old is not None and old.params != sig.params and "." not in name:
                changed[(fc.path, name)] = old
    added = {fc.path: {ln for h in fc.hunks for ln in h.added} for fc in py}
    names = sorted({name for _, name in changed})[:MAX_CHANGED]
    # files that may call a changed signature: one grep for all of them
    follow = {c for c in _git_grep(head.tree.repo, head_sha, names)[:MAX_CALLERS] if not _vendored(c)} if names else set()
    head.prefetch(follow)
    # the names a call of a changed signature ends in (a subclass reaches its base's by super().__init__)
    want = set(names) | ({"__init__"} if any(s.label.endswith(".__init__") for s in changed.values()) else set())
    old_path = {fc.path: fc.old_path or fc.path for fc in py if fc.status != "added"}
    out: list[Finding] = []
    seen: set[str] = set()
    touched_files = {fc.path for fc in py if fc.hunks}
    for caller in sorted(follow | touched_files):
        mod = head.module(caller)
        if mod is None:
            continue
        bmod = base.module(old_path[caller]) if caller in old_path else None
        base_calls = _by_key(bmod)
        lines_here = added.get(caller, set())
        # a file this PR does not touch is read for the calls of the changed signatures' names only
        for call, fn in calls_in(mod, names=None if caller in touched_files else want):
            # a call this PR writes or edits (an added line inside it, or text the base's file lacks: a removed
            # argument adds no line), or any call of a signature it changes
            edited = caller in touched_files and (
                call.key not in base_calls or any(ln in lines_here for ln in range(call.line, call.end_line + 1)))
            if not edited and caller not in follow:
                continue
            got = head.resolve_call(mod, fn)
            if got is None:
                continue
            sig = got[0]
            target = (got[1], sig.name)  # where it is defined, through re-exports
            if target not in changed and not edited:
                continue
            why = _misfit(head, got, call)
            if why is None or _shadowed(fn, call.func.split(".", 1)[0]):
                continue
            if bmod is None and caller in follow:  # a caller this PR does not change: its base is its head's path
                bmod = base.module(caller)
                base_calls = _by_key(bmod)
            # the same call at base, else the calls of the same function from the same place (an edited call)
            before = base_calls.get(call.key) or [
                (c, f) for cs in base_calls.values() for c, f in cs
                if c.func == call.func and _scope(f) == _scope(fn)]
            if before and bmod is not None and not any(_fits(base, bmod, c, f) for c, f in before):
                continue  # it did not fit at base either (or meant something else there): not this PR's
            if caller not in old_path and _copied_misfit(base, caller, call):
                continue  # a new file copies one of the base's, with this call and its misfit
            ident = hashlib.sha1("\0".join([RULE_ID, sig.path, sig.label, caller, call.text]).encode()).hexdigest()[:20]
            if ident in seen:
                continue
            seen.add(ident)
            out.append(_finding(call, sig, why, changed.get(target), ident, pillar_of, severity))
    return out


def _finding(call: Call, sig: Sig, why: str, old: Sig | None, ident: str, pillar_of: Callable[[str], str],
             severity: str) -> Finding:
    changed = ", whose parameters this PR changes" if old is not None else ""
    then = f" At the base it took `{old.render()}`." if old is not None else ""
    message = (f"the call `{clip(call.text, 80)}` ({call.path}:{call.line}) does not fit `{sig.label}`: it {why}. "
               f"`{sig.label}` takes `{sig.render()}` ({sig.path}:{sig.line}{changed}).{then} Fix: pass what it "
               "takes now, or keep the parameters its callers pass.")
    return Finding(
        rule=RULE_ID,
        pillar=pillar_of(call.path),
        severity=severity,  # type: ignore[arg-type]
        message=message,
        locations=[Location(call.path, call.line, call.end_line if call.end_line > call.line else None,
                            note="the call"), Location(sig.path, sig.line, note="the callee")],
        status="new",
        fingerprint=ident,
        state=ident,
        source="inferred",
        evidence=[f"{sig.path}:{sig.line} def {sig.label}{sig.text}"]
        + ([f"base: {old.path}:{old.line} def {old.label}{old.text}"] if old else []),
    )


__all__ = ["RULE_ID", "findings", "read_module", "Resolver", "Sig", "Param"]
