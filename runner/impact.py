"""Which test files a change reaches, name by name, not just module by module.

Importing a module is not using what changed in it: a test that imports
``engine.model`` for ``Attention`` is not affected by an edit inside
``param_count``, and deleting a helper nobody calls affects no test at all.
So a change is first turned into the top-level names it touches in each
module (the function, class, constant or import binding around each changed
line, old side for removed lines), then followed along import edges:

* ``from m import f``: the importer is affected when ``f`` changed; its own
  top-level statements that use ``f`` change in turn;
* ``import m`` / ``from pkg import m``: affected when the importer references
  a changed name as an attribute or name anywhere, or passes ``m`` to
  ``getattr``;
* inside a module, a statement that references a changed name changes too
  (``OPS = {"rms": rms}``, ``class B(A)``), to a fixpoint.

Whatever cannot be told apart by name counts as the whole module ("all"):
module-level code with effects (a call, a registry write), a changed
definition under a decorator that may register it, a file that does not parse,
an added, deleted or renamed module, and the use of ``importlib`` /
``__import__``. A module that is "all" makes every importer "all". Pytest's
conftest.py files are used without imports (fixtures by parameter name,
autouse), so any change that reaches one reaches every test below it.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from runner.imports import (
    Import,
    ImportGraph,
    _absolute,
    _statements,
    imports_of,
    parse_imports,
    parses,
    remember_imports,
    statement_imports,
    strings_run,
)

ALL: Literal["all"] = "all"
# a module with more top-level statements than this (100 000 lines of ``x = 1``) is read as opaque: its table
# would cost tens of seconds, and "anything in it may be used" is the safe answer
MAX_STATEMENTS = 20_000
Changed = frozenset[str] | Literal["all"]

# Decorators that neither register nor wrap a definition into something found by other means.
PURE_DECORATORS = {
    "staticmethod", "classmethod", "property", "cached_property", "dataclass", "cache", "lru_cache", "wraps",
    "fixture", "parametrize", "skip", "skipif", "xfail", "no_grad", "inference_mode", "jit", "autotune",
    "heuristics", "compile", "abstractmethod", "overload", "contextmanager", "final", "setter", "getter",
    "total_ordering", "njit", "override", "unique",
    # kernel DSLs wrap a function into a kernel or device op, registering nothing (CuTe DSL, TileLang/TVM, torch)
    "dsl_user_op", "kernel", "prim_func", "macro", "script", "custom_fwd", "custom_bwd", "deprecated",
    "no_type_check", "enable_grad",
    # torch.compiler / torch._dynamo: keep a function out of (or in) a traced graph
    "disable", "allow_in_graph", "assume_constant_result",
}
_DYNAMIC_CALLS = {"getattr", "hasattr", "vars", "dir", "getmembers"}
# in a file's text, ways to reach a module's names without spelling them
_UNSPELLED = (b"getattr", b"hasattr", b"vars(", b"dir(", b"getmembers", b"import_module", b"__import__")


@dataclass(frozen=True)
class Stmt:
    """One top-level statement: the names it binds and every name it references."""

    start: int
    end: int
    names: frozenset[str]
    refs: frozenset[str]
    effect: bool  # module-level code whose effect is not captured by the names it binds
    # a bare import statement: its names come from elsewhere, so one changed name does not change its siblings
    # (``from .interface import a, b`` in a package __init__ re-exports each name on its own)
    imports: bool = False
    # the top-level bindings it reads: names, parameters and import aliases, not attribute names (``torch.nn.X``
    # reads no binding ``nn``); None: take ``refs``
    uses: frozenset[str] | None = None
    # a definition its decorators register into a registry of the tree (``@MODELS.register_module()``,
    # ``@register_handler(Config)``): those bindings change with it, rather than the whole module
    registers: frozenset[str] = frozenset()
    registered_by_call: frozenset[str] = frozenset()  # those of them called as the decorator (``@register(C)``)
    # the classes it is registered for (``@register_handler(AWQConfig)``): only code naming one looks it up
    keys: frozenset[str] = frozenset()
    # a module-level registration call (``AutoModel.register(KDAConfig, KDAModel)``): the binding it is made
    # through and the bindings it hands over; through a library's registry it binds those names (``_registering``)
    call_base: str = ""
    call_args: frozenset[str] = frozenset()
    decorated_by: frozenset[str] = frozenset()  # the names of its decorators that may register (not pure ones)
    # the names a library registers it under, spelled as strings (``@torch.library.impl("ns::op", "CUDA")``):
    # code reaches it by spelling one (``torch.ops.ns.op``), not by importing it
    string_keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Binding:
    module: str  # absolute dotted module of the import
    name: str | None  # "from module import name"; None for "import module"
    local: str  # the name it binds in the importer
    stmt: int


@dataclass(frozen=True)
class ModuleInfo:
    stmts: tuple[Stmt, ...] = ()
    bindings: tuple[Binding, ...] = ()
    refs: frozenset[str] = frozenset()
    dynamic: frozenset[str] = frozenset()  # names passed to getattr & co.
    opaque: bool = False  # unparsable: every use is possible
    imports_by_name: bool = False  # importlib.import_module / __import__: modules picked at run time
    text: bytes = b""
    trivial: frozenset[int] = frozenset()  # blank and comment-only lines
    runs: tuple[str, ...] = ()  # modules run in a subprocess ("-m pkg.cli", "-c 'import pkg'"): all of them is used
    attrs: dict[str, frozenset[str]] = field(default_factory=dict)  # name → attributes read off it (m.f, a.b.c)
    escapes: frozenset[str] = frozenset()  # names used as values (in a tuple, passed on): any attribute may be read
    registries: frozenset[str] = frozenset()  # bindings decorated definitions register into (Stmt.registers)
    registry_functions: frozenset[str] = frozenset()  # those called as decorators: functions filling a table
    # top-level functions that, used as decorators, only wrap what they decorate (``@functools.wraps`` inside,
    # nothing stored into a table of the module at decoration time): decorating with them registers nothing
    wrappers: frozenset[str] = frozenset()
    strings: bytes = b""  # the string constants, one a line, of a module that imports by name


    def changed_at(self, lines: Iterable[int]) -> Changed:
        """Top-level names bound by the statements that hold ``lines``."""
        names: set[str] = set()
        for line in lines:
            if line in self.trivial:
                continue
            for s in self.stmts:
                if s.start <= line <= s.end:
                    if s.effect:
                        return ALL
                    names |= s.names | s.registers
                    break
        return frozenset(names)

    def close(self, seeds: Iterable[str]) -> Changed:
        """Seeds plus every name whose statement references a changed one, to a fixpoint."""
        changed = set(seeds)
        grew = True
        while grew:
            grew = False
            for s in self.stmts:
                if s.imports:
                    continue
                uses = s.refs if s.uses is None else s.uses
                if uses & changed and not (s.names | s.registers) <= changed:
                    if s.effect:
                        return ALL
                    changed |= s.names | s.registers
                    grew = True
                elif s.effect and uses & changed:
                    return ALL
        return frozenset(changed)

    def may_load(self, module_path: str, names: Changed, static: bool = False) -> bool:
        """Whether a run-time import here (``import_module(OPS[op])`` + ``getattr``) could reach ``names``.

        Only when the module's stem and one of the names appear somewhere in this file's text:
        registries spell both out as strings, however they are put together. ``static``: this file also
        imports the module by a statement (``from .cross_entropy import F``), so a stem spelled only in code
        is that import, and only a stem among the strings (``"pkg.ops.cross_entropy"``) says a run-time one.
        """
        if not self.imports_by_name:
            return False
        stem = module_path.rsplit("/", 1)[-1].removesuffix(".py")
        if stem == "__init__":
            stem = module_path.rsplit("/", 2)[-2] if "/" in module_path else stem
        if not _word(stem, self.strings if static else self.text):
            return False
        return names == ALL or any(_word(n, self.text) for n in names)


    def loaders(self) -> frozenset[str]:
        """The names bound by the statements that import by name (``import_module``, ``__import__``)."""
        lines = self.text.splitlines()
        out: set[str] = set()
        for st in self.stmts:
            if any(b"import_module" in ln or b"__import__" in ln for ln in lines[st.start - 1:st.end]):
                out |= st.names
        return frozenset(out)


@lru_cache(maxsize=256)
def _spelled(names: frozenset[str]) -> re.Pattern[bytes]:
    """Any of ``names`` as a whole word."""
    if not names:
        return re.compile(rb"(?!)")
    alternatives = b"|".join(re.escape(n.encode()) for n in sorted(names, key=len, reverse=True))
    return re.compile(rb"(?<![\w])(?:" + alternatives + rb")(?![\w])")


def _word(name: str, text: bytes) -> bool:
    return re.search(rb"(?<![\w])" + re.escape(name.encode()) + rb"(?![\w])", text) is not None


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` in the same (breadth-first) order, without its two generator layers per node."""
    todo = deque([node])
    node_type = ast.AST
    while todo:
        cur = todo.popleft()
        for name in cur._fields:
            child = getattr(cur, name, None)
            if isinstance(child, list):
                todo.extend(item for item in child if isinstance(item, node_type))
            elif isinstance(child, node_type):
                todo.append(child)
        yield cur


class _Scan:
    """One walk per statement for everything ``module_info`` reads off a module's expressions: the names each
    statement references, and, for the whole module, run-time imports, names handed to ``getattr`` & co.,
    attribute chains off each name, the loaded names that are no chain's base, and the string constants."""

    def __init__(self) -> None:
        self.by_name = False
        self.dynamic: set[str] = set()
        self.attrs: dict[str, set[str]] = {}
        self.bases: set[int] = set()
        self.loads: list[ast.Name] = []
        self.strings: list[str] = []

    def refs(self, node: ast.AST) -> tuple[set[str], set[str]]:
        """(every name and attribute name in ``node``, the bindings it reads: names, parameters, aliases)."""
        out: set[str] = set()
        uses: set[str] = set()
        name_t, attr_t, arg_t, alias_t, call_t, const_t, load_t = (
            ast.Name, ast.Attribute, ast.arg, ast.alias, ast.Call, ast.Constant, ast.Load)
        for sub in _walk(node):
            cls = sub.__class__
            if cls is name_t:
                out.add(sub.id)  # type: ignore[attr-defined]
                uses.add(sub.id)  # type: ignore[attr-defined]
                if sub.ctx.__class__ is load_t:  # type: ignore[attr-defined]
                    self.loads.append(sub)  # type: ignore[arg-type]
            elif cls is attr_t:
                out.add(sub.attr)  # type: ignore[attr-defined]
                owner = sub.value  # type: ignore[attr-defined]
                self.bases.add(id(owner))
                chain = [sub.attr]  # type: ignore[attr-defined]
                while owner.__class__ is attr_t:
                    chain.append(owner.attr)
                    owner = owner.value
                if owner.__class__ is name_t:
                    self.attrs.setdefault(owner.id, set()).update(chain)
            elif cls is arg_t:
                out.add(sub.arg)  # type: ignore[attr-defined]  # pytest fixtures arrive by parameter name
                uses.add(sub.arg)  # type: ignore[attr-defined]
            elif cls is alias_t:
                out.add((sub.asname or sub.name).split(".", 1)[0])  # type: ignore[attr-defined]
                uses.add((sub.asname or sub.name).split(".", 1)[0])  # type: ignore[attr-defined]
            elif cls is call_t:
                fn = _decorator_name(sub.func)  # type: ignore[attr-defined]
                if fn in ("import_module", "__import__"):
                    self.by_name = True
                elif fn in _DYNAMIC_CALLS and sub.args and isinstance(sub.args[0], ast.Name):  # type: ignore[attr-defined]
                    self.dynamic.add(sub.args[0].id)  # type: ignore[attr-defined]
            elif cls is const_t and isinstance(sub.value, str):  # type: ignore[attr-defined]
                self.strings.append(sub.value)  # type: ignore[attr-defined]
        return out, uses


def _decorator_base(node: ast.expr) -> str | None:
    """The binding a decorator is reached through: ``MODELS`` for ``@MODELS.register_module(name=…)``,
    ``register`` for ``@register(Config)``; None for anything else (a lambda, a subscript)."""
    while isinstance(node, ast.Call):
        node = node.func
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _string_keys(node: ast.expr) -> list[str]:
    """The op names a registering decorator's string arguments give: ``"ns::op"`` → ``op``, ``"op.overload"`` →
    ``op``; none unless the decorator is named like a registration and every string names an op."""
    if not isinstance(node, ast.Call) or not _REGISTERING.search(_decorator_name(node.func)):
        return []
    out = []
    for arg in node.args[:1]:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            name = arg.value.rsplit("::", 1)[-1].split(".", 1)[0].split("(", 1)[0]
            if re.fullmatch(r"[A-Za-z_]\w{3,}", name):
                out.append(name)
    return out


def _class_keys(node: ast.expr) -> frozenset[str]:
    """Capitalised names among a decorator call's arguments: the classes a handler is registered for."""
    if not isinstance(node, ast.Call):
        return frozenset()
    out = set()
    for arg in [*node.args, *(k.value for k in node.keywords)]:
        name = arg.attr if isinstance(arg, ast.Attribute) else arg.id if isinstance(arg, ast.Name) else ""
        if name[:1].isupper() and not name.isupper():
            out.add(name)
    return frozenset(out)


# decorator names that say they register what they decorate somewhere a library looks it up (``custom_op``,
# ``register_fake``, ``app.route``, ``app.get``, ``click.command``, ``hookimpl``)
_REGISTERING = re.compile(
    r"regist|custom_op|^op$|_op$|impl|route|hook|fake|librar|export|entry|plugin|command|group|handler|listen"
    r"|subscri|callback|^on_|task|endpoint|^(get|post|put|patch|delete|head|options|websocket)$|^define|^add_",
    re.IGNORECASE)


_LAYOUT_DIRS = {"src", "python", "lib", "py"}


def _block_heads(stmts: list[Stmt]) -> list[Stmt]:
    """A module-level ``if``/``try`` Stmt (it follows the Stmts inside it, ``_flat_statements``) has an effect
    only when one inside it still has one after ``_registering``, and fills the registries they fill: the
    condition of ``if Op.is_supported(): register_fusion(fuse_op)`` decides that registration, nothing more."""
    out: list[Stmt] = []
    for st in stmts:
        inner = []
        for prev in reversed(out):
            if prev.start < st.start or prev.end > st.end:
                break
            inner.append(prev)
        if inner and not st.imports and not st.registers:
            effect = any(i.effect for i in inner)
            registers = frozenset().union(*(i.registers for i in inner))
            by_call = frozenset().union(*(i.registered_by_call for i in inner))
            if effect != st.effect or registers:
                st = dataclasses.replace(st, effect=effect, registers=registers, registered_by_call=by_call)
        out.append(st)
    return out


def _registering(path: str, stmts: list[Stmt], bindings: list[Binding]) -> list[Stmt]:
    """Decorated definitions whose decorators all come from the tree's own package (imported from it, or
    defined here) register into a registry the tree holds: the definition and that registry binding change,
    not the whole module. A library's decorator named like a registration (``custom_op``, ``route``) keeps
    the whole module changed; any other library decorator only wraps. A module-level ``Lib.register(Key, Value)`` into a library's registry binds its arguments instead."""
    # the tree's package: the file's first directory, or the first after a layout one (``src/pkg/…``); a
    # directory deeper down named like a library (``pkg/transformers/``) does not make that library the tree's
    dirs = path.split("/")[:-1]
    package = set(dirs[:1]) | set([d for d in dirs if d not in _LAYOUT_DIRS][:1])
    own = {b.local for b in bindings if stmts[b.stmt].imports and b.module.split(".", 1)[0] in package}
    own |= {n for st in stmts if not st.imports for n in st.names}
    out = []
    for st in stmts:
        if st.call_base and st.call_base not in own and any(b.local == st.call_base for b in bindings):
            # a library's registry (``AutoModel.register(Cfg, Model)``): what is looked up under the keys it
            # was handed changes with them, so the statement binds them; nothing else of the module changes
            st = dataclasses.replace(st, names=st.names | st.call_args, effect=False)
        library = st.registers - own
        if library and (st.string_keys or not any(_REGISTERING.search(d) for d in st.decorated_by)):
            # a library registers it under names spelled as strings (``torch.library.impl("ns::op")``: code
            # spelling one reaches it, Impact.string_keys), or a library's decorator named like no registration
            # (``@can_return_tuple``, ``@cuda_required``, ``@torch.compile``) wraps the definition: the
            # definition changes alone, not the module's other names
            kept = st.registers & own
            st = dataclasses.replace(st, registers=kept, registered_by_call=st.registered_by_call & kept,
                                     keys=st.keys if kept else frozenset(), effect=False)
        if st.registers:
            if st.registers <= own:
                st = dataclasses.replace(st, effect=False)
            else:
                st = dataclasses.replace(st, registers=frozenset(), registered_by_call=frozenset(), keys=frozenset())
        out.append(st)
    return out


def _decorator_name(node: ast.expr) -> str:
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _bound(node: ast.stmt, imported: set[str]) -> tuple[set[str], bool]:
    """(names a top-level statement binds, whether it has an effect beyond binding them)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        effect = any(_decorator_name(d) not in PURE_DECORATORS for d in node.decorator_list)
        return {node.name}, effect
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".", 1)[0] for a in node.names if a.name != "*"}, False
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names: set[str] = set()
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
            base = t
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if base is not t and isinstance(base, ast.Name) and base.id in imported:
                return names, True  # os.environ[...] = ..., module.attr = ...: a global effect
        return names, False
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return set(), False  # a docstring
    own = _own_mutation(node, imported)
    if own:
        return {own}, False
    if isinstance(node, (ast.If, ast.Try)) or node.__class__.__name__ == "TryStar":
        names, effect = set(), False  # "if TYPE_CHECKING:", "try: import x / except ImportError: x = None"
        for inner in _block_statements(node):
            got, eff = _bound(inner, imported)
            names |= got
            effect = effect or eff
        return names, effect
    if isinstance(node, ast.Pass):
        return set(), False
    if isinstance(node, (ast.For, ast.AsyncFor)) and not _calls_beyond(node.iter, _PLAIN_ITERATION):
        # "for g in [1, 2, 4]: TABLE[g] = build(g)": it binds what its body binds, with the body's effects
        names = {sub.id for sub in ast.walk(node.target) if isinstance(sub, ast.Name)}
        effect = False
        for inner in [*node.body, *node.orelse]:
            got, eff = _bound(inner, imported)
            names |= got
            effect = effect or eff
        return names, effect
    return set(), True


_PLAIN_ITERATION = {"range", "enumerate", "zip", "sorted", "reversed", "list", "tuple", "items", "keys", "values"}


def _calls_beyond(node: ast.AST, allowed: set[str]) -> bool:
    """Whether ``node`` makes a call other than to one of ``allowed``."""
    return any(isinstance(sub, ast.Call) and _decorator_name(sub.func) not in allowed for sub in ast.walk(node))


_MUTATORS = {"append", "extend", "update", "add", "insert", "setdefault", "remove", "discard"}


def _own_mutation(node: ast.stmt, imported: set[str]) -> str | None:
    """The module's own binding a statement like ``__all__.extend([...])`` or ``TABLE.update({"k": f})``
    changes in place (with no call among its arguments): it binds that name again, with no other effect.
    None for anything else (``sys.path.append``: an imported module's state)."""
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return None
    func = node.value.func
    if not (isinstance(func, ast.Attribute) and func.attr in _MUTATORS and isinstance(func.value, ast.Name)):
        return None
    if func.value.id in imported:
        return None
    for arg in [*node.value.args, *(k.value for k in node.value.keywords)]:
        if any(isinstance(sub, (ast.Call, ast.Await, ast.Yield, ast.NamedExpr)) for sub in ast.walk(arg)):
            return None
    return func.value.id


def _block_statements(node: ast.stmt) -> list[ast.stmt]:
    """The statements directly inside an if/try (handlers included), not inside the defs among them."""
    out: list[ast.stmt] = []
    for name in ("body", "orelse", "finalbody"):
        out += getattr(node, name, None) or []
    for handler in getattr(node, "handlers", None) or []:
        out += handler.body
    return out


def _compound(node: ast.stmt) -> bool:
    return isinstance(node, (ast.If, ast.Try)) or node.__class__.__name__ == "TryStar"


def _flat_statements(node: ast.stmt, imported: set[str], scan: _Scan) -> list[tuple[Stmt, ast.stmt | None]]:
    """A top-level statement as Stmts, each with the node its import bindings come from (None: no bindings).

    A module-level ``if``/``try`` (``if triton.__version__ >= …: def …/else: raise``, ``try: from x import f;
    def g(): … / except ImportError: print(…)``) is one Stmt per statement inside it, then one for the block
    itself: a line inside a ``def`` there changes that name alone, while the condition, an ``else:`` or an
    ``except`` clause changes every name the block binds (and its effects). ``changed_at`` takes the first Stmt
    holding a line, so the inner ones come first.
    """
    if not _compound(node):
        names, effect = _bound(node, imported)
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        refs, uses = scan.refs(node)
        registers: frozenset[str] = frozenset()
        by_call: frozenset[str] = frozenset()
        decorated_by: frozenset[str] = frozenset()
        keys: frozenset[str] = frozenset()
        string_keys: frozenset[str] = frozenset()
        if effect and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            decorators = [d for d in node.decorator_list if _decorator_name(d) not in PURE_DECORATORS]
            decorated_by = frozenset(_decorator_name(d) for d in decorators)
            string_keys = frozenset(k for d in decorators for k in _string_keys(d))
            bases = [_decorator_base(d) for d in decorators]
            if all(bases):
                registers = frozenset(b for b in bases if b)  # kept only when they resolve (_registering)
                by_call = frozenset(b for d, b in zip(decorators, bases, strict=True)
                                    if b and isinstance(d.func if isinstance(d, ast.Call) else d, ast.Name))
                class_keys = [_class_keys(d) for d in decorators]
                keys = frozenset().union(*class_keys) if class_keys and all(class_keys) else frozenset()
        base, args = _registration_call(node) if effect else ("", frozenset())
        if base:  # a registration by call: a registry like a decorator's when the tree holds it (_registering)
            registers = frozenset({base})
            by_call = registers if isinstance(node.value.func, ast.Name) else frozenset()  # type: ignore[attr-defined]
            keys = frozenset()
        stmt = Stmt(start, node.end_lineno or node.lineno, frozenset(names), frozenset(refs), effect,
                    isinstance(node, (ast.Import, ast.ImportFrom)), frozenset(uses), registers, by_call,
                    keys if registers else frozenset(), base, args, decorated_by, string_keys)
        return [(stmt, node)]
    out: list[tuple[Stmt, ast.stmt | None]] = []
    for inner in _block_statements(node):
        out += _flat_statements(inner, imported, scan)
    names, effect = _bound(node, imported)
    heads: set[str] = set()
    head_uses: set[str] = set()
    parts = [node.test] if isinstance(node, ast.If) else []
    parts += [h.type for h in getattr(node, "handlers", None) or [] if h.type is not None]
    for part in parts:
        refs, uses = scan.refs(part)
        heads |= refs
        head_uses |= uses
    out.append((Stmt(node.lineno, node.end_lineno or node.lineno, frozenset(names), frozenset(heads), effect,
                     False, frozenset(head_uses)), None))
    return out


def _registration_call(node: ast.stmt) -> tuple[str, frozenset[str]]:
    """(the binding it goes through, the bindings it hands over) for ``X.register(A, B, exist_ok=True)`` or
    ``register_model(A)`` as a statement of its own; ("", ∅) for any other statement. Only names, attributes
    of names and constants as arguments: a call or a lambda among them may do anything."""
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return "", frozenset()
    call = node.value
    callee = call.func.attr if isinstance(call.func, ast.Attribute) else \
        call.func.id if isinstance(call.func, ast.Name) else ""
    if not callee.lower().startswith("register"):
        return "", frozenset()
    base = _decorator_base(call.func)
    args: set[str] = set()
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        while isinstance(arg, ast.Attribute):
            arg = arg.value
        if isinstance(arg, ast.Name):
            args.add(arg.id)
        elif not isinstance(arg, ast.Constant):
            return "", frozenset()
    if not base or not args:
        return "", frozenset()
    return base, frozenset(args)


def _bindings(path: str, index: int, node: ast.stmt) -> list[Binding]:
    """The import bindings a top-level statement makes, nested blocks included."""
    out: list[Binding] = []
    for inner in _statements([node]):
        if isinstance(inner, ast.Import):
            for a in inner.names:
                out.append(Binding(a.name, None, a.asname or a.name.split(".", 1)[0], index))
        elif isinstance(inner, ast.ImportFrom):
            base = _absolute(path, inner.module, inner.level)
            if base is not None:
                out += [Binding(base, a.name, a.asname or a.name, index) for a in inner.names]
    return out


def static_bindings(path: str, data: bytes | None) -> tuple[Binding, ...] | None:
    """A module's import bindings when they are all it can reach a module by; None when the full
    ``module_info`` must decide (it does not parse, or it may import by name at run time).

    One parse and no walk of expressions: ``importlib.import_module`` / ``__import__`` are spelled out in
    the text of an ASCII file, so a file without them imports by its statements alone.
    """
    if data is None or not data.isascii() or b"import_module" in data or b"__import__" in data:
        return None
    try:
        tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tuple(b for index, node in enumerate(tree.body) for b in _bindings(path, index, node))


def module_info(path: str, data: bytes | None) -> ModuleInfo:
    if data is None:
        return ModuleInfo(opaque=True)
    return analyse(path, data)[0]


def analyse(path: str, data: bytes) -> tuple[ModuleInfo, tuple[Import, ...], bool]:
    """One parse of a file: its table, its imports (as ``parse_imports`` reads them), whether ``ast`` parsed it."""
    try:
        tree = ast.parse(data, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ModuleInfo(opaque=True), tuple(parse_imports(path, data)), False
    if len(tree.body) > MAX_STATEMENTS:  # generated data as code: every use possible, at the cost of a parse
        return ModuleInfo(opaque=True), tuple(statement_imports(path, tree)), True
    try:
        info, strings = _tree_info(path, data, tree)
    except RecursionError:  # nesting deeper than the walks go
        return ModuleInfo(opaque=True), tuple(statement_imports(path, tree)), True
    return info, tuple(statement_imports(path, tree) + strings_run(strings)), True


def analyse_into_caches(path: str, blob: str | None, data: bytes) -> tuple[ModuleInfo, tuple[Import, ...]]:
    """``analyse``, remembered in both caches (this module's tables, ``runner.imports``' imports)."""
    info, found, parsed = analyse(path, data)
    remember_imports(path, blob, found, parsed)
    if blob is not None:
        if len(_INFO) > 50_000:
            _INFO.clear()
        _INFO[(path, blob)] = info
    return info, found


def _tree_info(path: str, data: bytes, tree: ast.Module) -> tuple[ModuleInfo, list[str]]:
    imported = {
        (a.asname or a.name).split(".", 1)[0]
        for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names
    }
    stmts: list[Stmt] = []
    bindings: list[Binding] = []
    scan = _Scan()
    for index, node in enumerate(tree.body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            stmts.append(Stmt(node.lineno, node.end_lineno or node.lineno, frozenset({"__doc__"}), frozenset(), False))
            scan.strings.append(node.value.value)
            continue  # argparse descriptions and --help read it
        for stmt, leaf in _flat_statements(node, imported, scan):
            if leaf is not None:
                bindings += _bindings(path, len(stmts), leaf)
            stmts.append(stmt)
    stmts = _block_heads(_registering(path, stmts, bindings))
    refs = frozenset().union(*(s.refs for s in stmts)) if stmts else frozenset()
    trivial = frozenset(
        n for n, line in enumerate(data.splitlines(), 1) if not line.strip() or line.lstrip().startswith(b"#")
    )
    runs = tuple(dict.fromkeys(imp.module for imp in strings_run(scan.strings)))
    escapes = {sub.id for sub in scan.loads if id(sub) not in scan.bases}
    wrappers = frozenset(node.name for node in tree.body
                         if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _wraps_only(node))
    return ModuleInfo(tuple(stmts), tuple(bindings), refs, frozenset(scan.dynamic), False, scan.by_name,
                      data if scan.by_name else b"", trivial, runs,
                      {k: frozenset(v) for k, v in scan.attrs.items()}, frozenset(escapes),
                      frozenset(n for st in stmts for n in st.registers),
                      frozenset(n for st in stmts for n in st.registered_by_call), wrappers,
                      "\n".join(scan.strings).encode("utf-8", "replace") if scan.by_name else b""), scan.strings


# calls that read or wrap a decorated function without keeping it anywhere
_WRAPPING_CALLS = PURE_DECORATORS | {
    "update_wrapper", "signature", "getfullargspec", "isinstance", "issubclass", "callable", "getattr", "hasattr",
    "len", "set", "list", "tuple", "dict", "frozenset", "str", "repr", "type", "id", "partial", "disable",
    "iscoroutinefunction", "isclass", "isfunction", "getsource", "warn",
}
_STORING_METHODS = {"append", "add", "register", "setdefault", "update", "insert", "extend", "__setitem__",
                    "appendleft"}


def _own_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a body, nested blocks (if, for, with, try) included, not the bodies of defs in it."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody"):
            stack.extend(reversed(getattr(node, name, None) or []))
        for handler in getattr(node, "handlers", None) or []:
            stack.extend(reversed(handler.body))
        for case in getattr(node, "cases", None) or []:
            stack.extend(reversed(case.body))


def _nested_defs(body: list[ast.stmt]) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in _own_statements(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
    return out


def _returned(body: list[ast.stmt], defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> list[str]:
    """The nested defs ``body`` returns by name (``return decorator``, ``return decorator(fn)``)."""
    out = []
    for node in _own_statements(body):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value.func if isinstance(node.value, ast.Call) else node.value
            if isinstance(value, ast.Name) and value.id in defs:
                out.append(value.id)
    return out


def _wraps_only(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``fn``, used as a decorator, only wraps: it returns a nested def, and the code that runs when it
    decorates (its own body and, for a factory ``@deco(arg)``, the body of the def it returns; not the wrapper
    that runs at call time) stores nothing outside its locals: no ``TABLE[k] = f``, ``REG.append(f)``,
    ``global``, and hands the decorated function to no call but ``wraps`` and the like."""
    defs = _nested_defs(fn.body)
    first = _returned(fn.body, defs)
    if not first:
        return False  # "return fn" after filling a table, or no decorator at all
    # what ``fn`` returns runs at decoration time when ``fn`` is a factory (``@deco(arg)``: it returns a def in
    # turn, the wrapper, whose body runs at call time); for a plain ``@deco`` it is the wrapper itself, read
    # all the same (a table filled at call time is taken as one filled when decorating: the old answer)
    levels: list[ast.FunctionDef | ast.AsyncFunctionDef] = [fn, *(defs[name] for name in dict.fromkeys(first))]
    params: set[str] = set()
    local: set[str] = set(defs)
    for level in levels:
        a = level.args
        params |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]}
        local |= set(_nested_defs(level.body))
    local |= params
    for level in levels:
        for node in _decoration_time(level):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                return False
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                local.add(node.id)
    for level in levels:
        for node in _decoration_time(level):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if isinstance(sub, (ast.Attribute, ast.Subscript)) and _base_name(sub) not in local:
                            return False  # a table or attribute outside the decorator's own locals
            elif isinstance(node, ast.Call):
                callee = _decorator_name(node.func)
                if isinstance(node.func, ast.Attribute) and callee in _STORING_METHODS \
                        and _base_name(node.func) not in local:
                    return False
                if callee == "setattr" and node.args and _base_name(node.args[0]) not in local:
                    return False
                passed = [x for x in [*node.args, *(k.value for k in node.keywords)]
                          if isinstance(x, ast.Name) and x.id in params]
                if passed and callee not in _WRAPPING_CALLS and callee not in defs and callee not in local:
                    return False  # handed to a function that may keep it
    return True


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _decoration_time(level: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``level``'s body, decorators of nested defs included, their bodies not."""
    todo: deque[ast.AST] = deque(level.body)
    while todo:
        node = todo.popleft()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if not isinstance(node, ast.Lambda):
                todo.extend(node.decorator_list)
            continue
        todo.extend(ast.iter_child_nodes(node))


def without_wrappers(path: str, info: ModuleInfo, graph: ImportGraph, info_of_path: Callable[[str], ModuleInfo]
                     ) -> ModuleInfo:
    """``info`` with the decorators that only wrap (``_wraps_only``, followed through re-exports) no longer
    counted as registries: a changed ``@dispatch("op")`` or ``@input_guard`` definition changes its own name,
    not the decorator and every other definition it decorates."""
    if not info.registry_functions:
        return info
    imported = {b.local: b for b in info.bindings if info.stmts[b.stmt].imports}
    wrap = set()
    for local in info.registry_functions:
        b = imported.get(local)
        if b is None:
            if local in info.wrappers:
                wrap.add(local)
        elif b.name and b.name != "*" and _resolves_to_wrapper(graph, info_of_path, b.module, b.name, path):
            wrap.add(local)
    if not wrap:
        return info
    stmts = []
    for st in info.stmts:
        if st.registers & wrap:
            registers = st.registers - frozenset(wrap)
            st = dataclasses.replace(st, registers=registers, registered_by_call=st.registered_by_call - wrap,
                                     keys=st.keys if registers else frozenset())
        stmts.append(st)
    return dataclasses.replace(info, stmts=tuple(stmts), registries=frozenset(n for st in stmts for n in st.registers),
                               registry_functions=info.registry_functions - frozenset(wrap))


def _resolves_to_wrapper(graph: ImportGraph, info_of_path: Callable[[str], ModuleInfo], module: str, name: str,
                         importer: str) -> bool:
    for _ in range(6):  # a few re-exports (``pkg/utils/__init__.py``: ``from ._decorators import input_guard``)
        path = graph.module_file(module, importer)
        if path is None or not path.endswith(".py"):
            return False
        info = info_of_path(path)
        if info.opaque:
            return False
        if name in info.wrappers:
            return True
        nxt = next((b for b in info.bindings if b.local == name and b.name and info.stmts[b.stmt].imports), None)
        if nxt is None:
            return False
        module, name, importer = nxt.module, nxt.name or "", path
    return False


_INFO: dict[tuple[str, str], ModuleInfo] = {}


def info_of(path: str, blob: str | None, read: Callable[[str], bytes | None]) -> ModuleInfo:
    """ModuleInfo cached by (path, blob): replaying a history re-parses only what changed."""
    if blob is not None and (path, blob) in _INFO:
        return _INFO[(path, blob)]
    data = read(path)
    if data is None:
        return ModuleInfo(opaque=True)
    return analyse_into_caches(path, blob, data)[0]


def importers(graph: ImportGraph, tests: list[str]) -> dict[str, list[str]]:
    """Module → the files that import it, among those the tests reach: only these modules' names matter."""
    users: dict[str, list[str]] = {}
    seen = set(tests)
    queue = deque(tests)
    while queue:
        cur = queue.popleft()
        for nxt in graph.edges(cur):
            users.setdefault(nxt, []).append(cur)
            if nxt not in seen and nxt.endswith(".py"):
                seen.add(nxt)
                queue.append(nxt)
    return users


def _close_except(info: ModuleInfo, seeds: set[str], keep: set[str]) -> Changed:
    """``info.close(seeds)`` that never marks the definitions in ``keep``: a registry's table changing does not
    change the function that fills it (else every other module registering through it would change too)."""
    if not keep:
        return info.close(seeds)
    changed = set(seeds)
    grew = True
    while grew:
        grew = False
        for st in info.stmts:
            if st.imports or st.names & keep:
                continue
            uses = st.refs if st.uses is None else st.uses
            if uses & changed and not (st.names | st.registers) <= changed:
                if st.effect:
                    return ALL
                changed |= st.names | st.registers
                grew = True
    return frozenset(changed)


class OverBudget(RuntimeError):
    """``Impact.run`` would read more modules than its budget."""


@dataclass
class Impact:
    """Propagates changed names from changed modules to the test files that use them."""

    graph: ImportGraph
    info: Callable[[str], ModuleInfo]
    changed: dict[str, Changed]  # changed module → its changed names (ALL for the whole module)
    state: dict[str, Changed] = field(default_factory=dict, init=False)
    # module → {name it binds a changed module to at top level: that module's changed names} (``pkg.sub.f``)
    exports: dict[str, dict[str, Changed]] = field(default_factory=dict, init=False)
    parent: dict[str, str | None] = field(default_factory=dict, init=False)
    budget: int | None = None  # most modules whose full table may be read; past it run() raises OverBudget
    # registry module → the classes its changed entries are registered for (``@register_handler(AWQConfig)``)
    keyed: dict[str, frozenset[str]] = field(default_factory=dict, init=False)
    keyed_registries: bool = True  # False: leave out the registries whose changed entries have class keys
    _via_export: set[str] = field(default_factory=set, init=False)
    _read: set[str] = field(default_factory=set, init=False)

    def run(self, tests: list[str], users: dict[str, list[str]] | None = None) -> None:
        """Propagate from the changed modules; ``users`` is ``importers(graph, tests)`` when already known."""
        if users is None:
            users = importers(self.graph, tests)
        work: deque[str] = deque()
        for path, names in self.changed.items():
            if names == ALL or names:
                self.state[path] = names
                self.parent[path] = None
                work.append(path)
        while work:
            mod = work.popleft()
            for source, got, keys in self._registered_into(mod):
                if keys:
                    self.keyed[source] = self.keyed.get(source, frozenset()) | keys
                    if not self.keyed_registries:
                        continue
                old = self.state.get(source, frozenset())
                new = ALL if ALL in (old, got) else frozenset(old | got)  # type: ignore[operator]
                if new != old:
                    self.state[source] = new
                    self.parent.setdefault(source, mod)
                    work.append(source)
            for user in users.get(mod, []):
                got, exported = self._through(user, mod)
                grew = False
                if got:
                    old = self.state.get(user, frozenset())
                    new = ALL if ALL in (old, got) else frozenset(old | got)  # type: ignore[operator]
                    if new != old:
                        self.state[user] = new
                        grew = True
                        if user in self._via_export:  # the chain goes where its names changed from
                            self._via_export.discard(user)
                            self.parent[user] = mod
                mine = self.exports.setdefault(user, {})
                for local, sub_names in exported.items():
                    before = mine.get(local, frozenset())
                    after = ALL if ALL in (before, sub_names) else frozenset(before | sub_names)  # type: ignore[operator]
                    if after != before:
                        mine[local] = after
                        grew = True
                if grew:
                    if user not in self.parent and user not in self.state:
                        self._via_export.add(user)  # only a module binding re-exported so far
                    self.parent.setdefault(user, mod)
                    work.append(user)

    def _registered_into(self, mod: str) -> list[tuple[str, Changed, frozenset[str]]]:
        """(module, its changed names) for each registry of the tree a changed definition of ``mod`` registers
        into: ``@MODELS.register_module()`` with ``from .base import MODELS`` changes ``MODELS`` in base.py (and
        what there reads it: ``build_model``); ``@register_handler(C)`` changes ``register_handler`` and the
        table its body fills. Tests reach a registered definition through the registry, not by its name."""
        names = self.state.get(mod, frozenset())
        if names == ALL or not names:
            return []
        info = self.info(mod)
        hit = names & info.registries
        out: list[tuple[str, Changed, frozenset[str]]] = []
        imported = {b.local: b for b in info.bindings if info.stmts[b.stmt].imports}
        for local in sorted(hit):
            b = imported.get(local)
            source: str | None = mod
            name, module_binding = local, False
            if b is not None:
                source = self.graph.module_file(b.module, mod)
                name, module_binding = (b.name or ""), b.name is None
            if source is None:
                return [(mod, ALL, frozenset())]  # a registry the graph cannot find: as before, all of mod
            src = self.info(source)
            if src.opaque:
                out.append((source, ALL, frozenset()))
                continue
            entries = [st for st in info.stmts if st.names & names and local in st.registers]
            keys = frozenset().union(*(st.keys for st in entries)) \
                if entries and all(st.keys for st in entries) else frozenset()
            if module_binding:  # "import pkg.registry as r" then "@r.MODELS.register()"
                seeds = set(info.attrs.get(local, frozenset()))
                fills: set[str] = set()
            elif local in info.registry_functions:  # "@register(C)": the table its body fills changes
                fills = {name}
                bound = {n for st in src.stmts if not st.imports for n in st.names}
                seeds = {n for st in src.stmts if name in st.names and not st.imports
                         for n in (st.uses if st.uses is not None else st.refs) & bound} - fills
                if not seeds:  # it fills no table of the tree (torch.library underneath): all of mod, as before
                    return [(mod, ALL, frozenset())]
            else:  # "@MODELS.register_module()": the registry object itself
                seeds, fills = {name}, set()
            if seeds:
                out.append((source, _close_except(src, seeds, fills), keys))
        return out

    def string_keys(self) -> frozenset[str]:
        """The op names that changed definitions are registered under by a library (``Stmt.string_keys``)."""
        out: set[str] = set()
        for mod, names in self.state.items():
            if names == ALL or not mod.endswith(".py"):
                continue
            for st in self.info(mod).stmts:
                if st.string_keys and st.names & names:
                    out |= st.string_keys
        return frozenset(out)

    def keys_spelled(self, paths: list[str]) -> bool:
        """Whether one of the files names a class a changed registry entry is registered for."""
        keys = frozenset().union(*self.keyed.values()) if self.keyed else frozenset()
        pattern = _spelled(keys)
        return bool(keys) and any(pattern.search(self.graph.read(p) or b"") for p in paths)

    def _through(self, user: str, mod: str) -> tuple[Changed, dict[str, Changed]]:
        """(what of ``user`` changes, the module bindings it re-exports) because ``mod`` changed.

        A top-level ``from . import sub`` or ``import a.b`` makes the module an attribute of ``user``
        (``pkg.sub.f``): that binding is re-exported, so ``user``'s importers are checked for it, but the
        binding alone does not make ``user`` itself changed (a test is selected only for what it uses).
        """
        names = self.state.get(mod, frozenset())
        via = self.exports.get(mod, {})
        if mod in self.graph.conftests(user):
            return ALL, {}  # fixtures by name and autouse: any change in a conftest reaches its tests
        if names != ALL and self._spells_none(user, mod, names, via):
            return frozenset(), {}
        if self.budget is not None and user not in self._read:
            self._read.add(user)
            if len(self._read) > self.budget:
                raise OverBudget(f"more than {self.budget} modules to read")
        info = self.info(user)
        if names and info.opaque:
            return ALL, {}
        loaded: frozenset[str] = frozenset()
        static = any(self.graph.module_file(b.module, user) == mod or self._module_object(user, b, mod)
                     for b in info.bindings) if info.imports_by_name else False
        if names and info.may_load(mod, names, static):  # dotted strings fed to import_module too
            if names == ALL:
                return ALL, {}
            # ``import_module("pkg.sub")`` then ``getattr(module, name)`` (a lazy ``__getattr__``, an op table):
            # the changed names it spells are this module's now, and so is the code that loads them
            got = info.close({n for n in names if _word(n, info.text)} | info.loaders())
            if got == ALL:
                return ALL, {}
            loaded = got
        for run in () if info.imports_by_name else info.runs:  # a subprocess runs the module: all of it may run
            target = self.graph.module_file(run, user)
            if target == user:
                continue  # its own dotted name (Registry(locations=['pkg.models.base'])): nothing else runs
            if target == mod or (names == ALL and mod in self.graph.resolve(run, user)):
                return ALL, {}  # a package __init__ on the way runs too, but only its effects reach the module
        seeds: set[str] = set()
        exported: dict[str, Changed] = {}
        for b in info.bindings:
            hit = self._binding_hit(user, b, mod, names, info) if names else frozenset()
            if hit != ALL and via and self._module_object(user, b, mod):
                hit = self._through_exports(b, via, info) or hit
            if hit == ALL:
                return ALL, {}
            if hit:
                seeds |= hit
            if names and self._module_object(user, b, mod) and b.local in info.stmts[b.stmt].names:
                exported[b.local] = names
        if loaded:
            closed = info.close(seeds | loaded)
            return closed, ({} if closed == ALL else exported)
        return (info.close(seeds) if seeds else frozenset()), exported

    def _spells_none(self, user: str, mod: str, names: frozenset[str], via: dict[str, Changed]) -> bool:
        """Whether ``user`` provably uses none of ``names`` (nor the modules bound in ``via``) without the
        full table: none is spelled in its text, and it has no way to reach a name unspelled (``import *``,
        ``getattr`` & co., run-time imports, a module run in a subprocess). A package ``__init__`` run on the
        way is an edge of every module below it; most of those never say its names."""
        blob = self.graph.blob_sha(user) if self.graph.blob_sha else None
        if not parses(user, blob, self.graph.read):
            return False  # a file that does not parse may use anything
        data = self.graph.read(user)
        if data is None or any(word in data for word in _UNSPELLED):
            return False
        stem = mod.rsplit("/", 1)[-1].removesuffix(".py")
        if stem == "__init__":
            stem = mod.rsplit("/", 2)[-2] if "/" in mod else stem
        if _spelled(frozenset(names) | frozenset(via) | {stem}).search(data):
            return False  # ("from pkg import mod" binds the module: its names need no spelling here)
        return not any(imp.run or "*" in imp.names for imp in imports_of(user, blob, self.graph.read))

    @staticmethod
    def _through_exports(b: Binding, via: dict[str, Changed], info: ModuleInfo) -> Changed:
        """``import pkg`` then ``pkg.sub.f``: a changed module re-exported by ``pkg`` as ``sub``."""
        seen = info.refs if b.local in info.escapes else info.attrs.get(b.local, frozenset())
        for local, sub_names in via.items():
            if local in seen and (sub_names == ALL or sub_names & seen):
                users = [s for s in info.stmts if b.local in s.refs]
                return frozenset(n for s in users for n in s.names | s.registers) or ALL
        return frozenset()

    def _module_object(self, user: str, b: Binding, mod: str) -> bool:
        """Whether ``b`` binds ``mod`` itself as a module object (``import mod``, ``from pkg import mod``)."""
        if b.name is None:
            return self.graph.module_file(b.module, user) == mod
        return b.name != "*" and self.graph.module_file(f"{b.module}.{b.name}", user) == mod

    def _binding_hit(self, user: str, b: Binding, mod: str, names: Changed, info: ModuleInfo) -> Changed:
        full = self.graph.module_file(b.module, user)
        if b.name is not None and b.name != "*":
            sub = self.graph.module_file(f"{b.module}.{b.name}", user)
            if sub == mod:  # "from pkg import submodule": a module object
                return self._module_use(b, names, info)
        if full == mod:
            if b.name is None:
                return self._module_use(b, names, info)
            if names == ALL:
                return ALL
            if b.name == "*":  # the public names come along
                return frozenset(n for n in names if not n.startswith("_"))
            return frozenset({b.local}) if b.name in names else frozenset()
        if mod in self.graph.resolve(b.module, user):  # a package __init__ run on the way
            if names == ALL:
                return ALL
            if b.name is None and b.local == b.module.split(".", 1)[0]:
                return self._module_use(b, names, info)
        return frozenset()

    @staticmethod
    def _module_use(b: Binding, names: Changed, info: ModuleInfo) -> Changed:
        if names == ALL:
            return ALL
        if b.local in info.dynamic:
            return frozenset(s_name for s in info.stmts if b.local in s.refs for s_name in s.names) or ALL
        # "for m in (a, b): m.KIND": once the module is a value, any attribute read in the file may be on it
        seen = info.refs if b.local in info.escapes else info.attrs.get(b.local, frozenset())
        used = names & seen
        if not used:
            return frozenset()
        users = [s for s in info.stmts if b.local in s.refs and (s.refs & used or b.local in info.escapes)]
        if any(s.effect for s in users):
            return ALL
        return frozenset(n for s in users for n in s.names | s.registers) or frozenset(used)

    def chain(self, test: str) -> list[str] | None:
        if test not in self.state:
            return None
        out = [test]
        while self.parent.get(out[-1]) is not None and len(out) < 64:
            out.append(self.parent[out[-1]])  # type: ignore[arg-type]
        return out
