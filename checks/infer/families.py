"""Name families: the sets of names a codebase writes down in one place (an enum, a switch, a table).

Inference looks for families that agree across files. Each family kind is one
tree-sitter pattern with an ``@_ctx`` capture (what names the family: the enum,
the variable, the registering callee) and a ``@key`` capture (one member). The
same pattern, with ``(#eq? @_ctx "NAME")`` added, is the ``[[fact]]`` query the
inferred rule runs through checks/facts.py, so the rows the rule engine reads at
head are the rows inference mined at base.

Rows per blob are plain tuples, cached in memory and on disk by blob SHA: a
repo's second audit re-reads only the files that changed.
"""

from __future__ import annotations

import os
import pickle
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import tree_sitter as ts

from checks import syntax
from checks.facts import read_blobs

VERSION = 26  # bump when a pattern changes: cached rows of an older pattern set are not reused
MAX_BYTES = 1_000_000  # generated tables and vendored amalgamations say nothing about the code's intent (ggml.c is 0.6 MB, by hand)
MAX_CACHED = 60_000  # blobs kept in a repo's on-disk member cache before it is pruned to one tree


@dataclass(frozen=True)
class Kind:
    """One family kind: a pattern per grammar, and how members are named and grouped."""

    name: str
    langs: tuple[str, ...]
    pattern: str  # ``{pred}`` marks where the context predicate goes
    scope: bool = False  # the family is "the keys inside function @_ctx" (no @_ctx capture; fact scope)
    repo_wide: bool = False  # members spread over many files (registrations): one family per context
    ctx_filter: str | None = None  # a regex the context must match (registration-like callees)
    values: bool = False  # the pattern captures @value too (tables)
    affixed: bool = False  # a family only when its members share an affix (``*_layer`` methods, not every method)
    whole_file: bool = False  # no @_ctx: the file is the context (module-level definitions)
    # Counted, not a name family: the member is the enclosing function, the value what @key holds
    # (``int num_inputs = 2`` → register_x_task: 2; one member per ``g.new_input(...)`` call).
    fn_key: bool = False
    # Prefix groups of one file are parallel tables (``kernel_mul_mm_*`` and ``kernel_mul_mm_id_*``): a group
    # leaves out a longer sibling group, and groups of one file may relate to each other.
    siblings: bool = False
    # Mined apart (checks/infer/sources.py), not as a name family: source files a build list names, the names a
    # package module imports.
    apart: bool = False


# A string naming a C-family source file, quotes included (no spaces, no interpolation): tree-sitter regex syntax.
SRC_EXTS = ("cu", "cpp", "cc", "cxx", "c")
SRC_STRING = "^[rRuUbB]?[\\\"'][A-Za-z0-9_./-]*[A-Za-z0-9_-][.](" + "|".join(SRC_EXTS) + ")[\\\"']$"
_REGISTER = r"(^|\.)(register\w*|\w+_register|def|impl|define|custom_op|register_fake|add_\w*op\w*)$"

_C = ("c", "cpp", "cuda")
KINDS: tuple[Kind, ...] = (
    Kind("enum", _C, "(enum_specifier name: (type_identifier) @_ctx body: (enumerator_list (enumerator name: (identifier) @key)){pred})"),
    # What a function dispatches on: its ``case`` labels, and the constants an ``if``/``||`` chain compares
    # with (``src0->type == GGML_TYPE_F32 || ...``): the same belief, written as a switch or as a chain.
    Kind(
        "case",
        _C,
        "(case_statement value: (_) @key{pred})\n"
        '(binary_expression operator: "==" right: (identifier) @key (#match? @key "^[A-Z][A-Z0-9_]*[A-Z0-9]$"){pred})',
        scope=True,
    ),
    Kind(
        "array",
        _C,
        "(init_declarator declarator: (array_declarator declarator: (identifier) @_ctx) value: (initializer_list [(string_literal) (identifier)] @key){pred})\n"
        "(init_declarator declarator: (pointer_declarator declarator: (array_declarator declarator: (identifier) @_ctx)) value: (initializer_list [(string_literal) (identifier)] @key){pred})\n"
        "(init_declarator declarator: (array_declarator declarator: (identifier) @_ctx) value: (initializer_list (initializer_list . [(string_literal) (identifier)] @key)){pred})",
    ),
    # A C++ registry by initializer: ``std::unordered_map<std::string, Act> kActs = {{"relu", ...}, ...}``,
    # ``static constexpr std::array<std::string_view, 26> LLM = {"chatglm", ...}`` (a local one too: a lookup table).
    Kind(
        "c-list",
        ("cpp", "cuda"),
        "(init_declarator declarator: (identifier) @_ctx value: (initializer_list (string_literal) @key){pred})\n"
        "(init_declarator declarator: (identifier) @_ctx value: (initializer_list (initializer_list . "
        "[(string_literal) (qualified_identifier)] @key)){pred})",
    ),
    Kind(
        "c-register",
        _C,
        "(call_expression function: [(identifier) (field_expression) (qualified_identifier)] @_ctx arguments: (argument_list . (string_literal) @key){pred})",
        repo_wide=True,
        ctx_filter=_REGISTER,
    ),
    Kind(
        "c-map",
        _C,
        "(assignment_expression left: (subscript_expression argument: [(identifier) (field_expression)] @_ctx "
        "indices: (subscript_argument_list [(identifier) (qualified_identifier) (string_literal)] @key)) "
        "right: (string_literal) @value{pred})",
        values=True,
    ),
    # ``if (name == "linear") ... else if (name == "rmsnorm")``: the names a C++ value is tested against.
    Kind(
        "c-compare",
        _C,
        '(binary_expression left: [(identifier) (field_expression)] @_ctx operator: "==" right: (string_literal) @key{pred})',
    ),
    Kind(
        "c-int",
        _C,
        "(declaration declarator: (init_declarator declarator: (identifier) @_ctx value: (number_literal) @key){pred})",
        ctx_filter=r"^num_\w+$",
        fn_key=True,
    ),
    # The constant a function hands on: ``register_task_variant(TASK_RMSNORM, code)`` in ``register_rmsnorm_task``
    # (member: the enclosing function, value: the constant). See mine.named_constants.
    Kind(
        "c-call-const",
        _C,
        "(call_expression function: [(identifier) (field_expression) (qualified_identifier)] @_ctx "
        'arguments: (argument_list . (identifier) @key (#match? @key "^[A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9]$")){pred})',
        fn_key=True,
    ),
    # Metal kernels by the name the host looks them up with: ``[[host_name("kernel_mul_mm_q4_0_f32")]]``.
    Kind(
        "host-name",
        ("cpp",),
        '(attribute name: (identifier) @_n (argument_list . (string_literal) @key) (#eq? @_n "host_name"){pred})',
        affixed=True,
        whole_file=True,
        siblings=True,
    ),
    # Cython mirrors of C++ enums (``cdef enum OpKind:`` in a .pxd): read by a regex (no grammar here), one
    # family per enum whose members share a prefix, so the rule's regex fact reads exactly that enum at head.
    Kind("pyx-enum", ("cython",), ""),
    # The headers a C-family file includes by quoted path, by stem (``#include "kernels/linear.cuh"`` → linear):
    # read by a regex (INCLUDE_REGEX), one family per file. Only ever the bigger side of a relation (see mine).
    Kind("c-include", _C, "", whole_file=True),
    Kind(
        "py-enum",
        ("python",),
        "(class_definition name: (identifier) @_ctx superclasses: (argument_list [(identifier) (attribute)] @_base) "
        'body: (block (expression_statement (assignment left: (identifier) @key))) (#match? @_base "Enum$|Flag$"){pred})',
    ),
    Kind(
        "dict",
        ("python",),
        "(assignment left: [(identifier) (attribute)] @_ctx right: (dictionary (pair key: (string) @key value: (_) @value)){pred})",
        values=True,
    ),
    # A table keyed by an enum's members (``{QuantMethod.AWQ: AWQConfig, ...}``): by the member, its class dropped.
    Kind(
        "dict-attr",
        ("python",),
        "(assignment left: [(identifier) (attribute)] @_ctx right: (dictionary (pair key: (attribute) @key value: (_) @value)){pred})",
        values=True,
    ),
    Kind(
        "list",
        ("python",),
        "(assignment left: [(identifier) (attribute)] @_ctx right: [(list (string) @key) (tuple (string) @key) (set (string) @key)]{pred})\n"
        # ``ffi_funcs=["init", "step"]``, ``choices=["flash", "triton"]``: a list handed over by keyword
        "(keyword_argument name: (identifier) @_ctx value: [(list (string) @key) (tuple (string) @key) (set (string) @key)]{pred})",
    ),
    Kind(
        "py-methods",
        ("python",),
        "(class_definition name: (identifier) @_ctx body: (block (function_definition name: (identifier) @key)){pred})",
        affixed=True,
    ),
    # An interface: the methods a base class declares abstract (``@abc.abstractmethod``), which every concrete
    # subclass must define ...
    Kind(
        "py-abstract",
        ("python",),
        "(class_definition name: (identifier) @_ctx body: (block (decorated_definition (decorator) @_d "
        'definition: (function_definition name: (identifier) @key))) (#match? @_d "abstractmethod$"){pred})',
    ),
    # ... and the methods a class with a base defines, decorated or not: only ever the bigger side, of an interface.
    Kind(
        "py-class-methods",
        ("python",),
        "(class_definition name: (identifier) @_ctx superclasses: (argument_list) body: (block "
        "[(function_definition name: (identifier) @key) (decorated_definition definition: (function_definition "
        "name: (identifier) @key))]){pred})",
    ),
    Kind(
        "py-functions",
        ("python",),
        "(module (function_definition name: (identifier) @key){pred})\n"
        "(module (decorated_definition definition: (function_definition name: (identifier) @key)){pred})",
        affixed=True,
        whole_file=True,
    ),
    Kind(
        "dict-values",
        ("python",),
        "(assignment left: [(identifier) (attribute)] @_ctx right: (dictionary (pair value: (identifier) @key)){pred})",
    ),
    Kind(
        "py-calls",
        ("python",),
        "(call function: (attribute attribute: (identifier) @_ctx) @key{pred})",
        ctx_filter=r"^(new|add|append|emit|create|declare|register)_\w+$",
        fn_key=True,
    ),
    # ``if mode == "x"`` and ``if mode in ("x", "y")``: the names a value is tested against.
    Kind(
        "compare",
        ("python",),
        "(comparison_operator [(identifier) (attribute)] @_ctx (string) @key{pred})\n"
        "(comparison_operator [(identifier) (attribute)] @_ctx [(tuple (string) @key) (list (string) @key) (set (string) @key)]{pred})",
    ),
    # A build list's source files: ``"csrc/norm.cu"`` in setup.py or a JIT spec (checks/infer/sources.py).
    Kind(
        "src-file",
        ("python",),
        "((string) @key (#match? @key \"" + SRC_STRING + "\"){pred})",
        whole_file=True,
        apart=True,
    ),
    # What a package module imports from itself (``from .chunk import chunk_gla``), against its ``__all__``.
    Kind(
        "py-imports",
        ("python",),
        "(import_from_statement module_name: (_) @_ctx name: [(dotted_name) @key (aliased_import alias: (identifier) @key)]{pred})",
        apart=True,
    ),
    # Sizes a switch dispatches on (``switch (head_dim) { case 64: ... }``) and the sizes Python accepts
    # (``head_dim in (64, 128)``, ``HEAD_DIMS = [64, 128, 256]``): mined apart (checks/infer/numbers.py), by subject.
    Kind(
        "c-num-case",
        _C,
        "(switch_statement condition: (condition_clause value: (_) @_ctx) body: (compound_statement "
        "(case_statement value: (number_literal) @key)){pred})",
        apart=True,
    ),
    Kind(
        "py-num",
        ("python",),
        "(comparison_operator [(identifier) (attribute)] @_ctx [(list (integer) @key) (tuple (integer) @key) "
        "(set (integer) @key)]{pred})\n"
        '(comparison_operator [(identifier) (attribute)] @_ctx "==" (integer) @key{pred})\n'
        "(assignment left: [(identifier) (attribute)] @_ctx right: [(list (integer) @key) (tuple (integer) @key) "
        "(set (integer) @key)]{pred})\n"
        "(keyword_argument name: (identifier) @_ctx value: [(list (integer) @key) (tuple (integer) @key) "
        "(set (integer) @key)]{pred})",
        apart=True,
    ),
    Kind(
        "py-register",
        ("python",),
        "(call function: [(identifier) (attribute)] @_ctx arguments: (argument_list (string) @key){pred})",
        repo_wide=True,
        ctx_filter=_REGISTER,
    ),
)
KIND_BY_NAME = {k.name: k for k in KINDS}


_QUOTE = '[\\"\']?'  # a string member's text starts with its quote (escaped for the query's string)


def query_text(kind: Kind, ctx: str | None, lang: str, label: str = "", extra: str = "",
               not_labels: tuple[str, ...] = ()) -> str:
    """The kind's pattern for ``lang``, restricted to one context when ``ctx`` is given (the fact's query).

    ``label``: for case labels, the enum prefix (``GGML_UNARY_OP_``) the labels must start with, so one
    switch over two enums is two families.
    """
    pred = "" if ctx is None or kind.scope or kind.whole_file else f' (#eq? @_ctx "{_escape(ctx)}")'
    if ctx is None and kind.ctx_filter:  # mining: let the query drop calls no registry makes, before Python sees them
        pred += f' (#match? @_ctx "{_escape(kind.ctx_filter)}")'
    if label:
        pred += f' (#match? @key "^{_QUOTE}{_escape(re.escape(label))}")'
    for other in not_labels:  # a longer sibling group is a family of its own
        pred += f' (#not-match? @key "^{_QUOTE}{_escape(re.escape(other))}")'
    if extra:
        pred += " " + extra
    text = kind.pattern.replace("{pred}", pred) if "{pred}" in kind.pattern else kind.pattern[:-1] + pred + ")"
    if lang == "c":  # C has no qualified names, and one subscript index; a switch's condition is parenthesised
        text = text.replace(" (qualified_identifier)", "").replace("indices: (subscript_argument_list ", "index: (")
        text = text.replace("condition: (condition_clause value: (_) @_ctx)", "condition: (parenthesized_expression (_) @_ctx)")
    return text


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


_QUOTED = re.compile(r'^(?:[rbuRBUfF]{0,2})("""|\'\'\'|"|\')(.*)\1$', re.S)
_DECLARATORS = ("identifier", "qualified_identifier", "field_identifier", "destructor_name", "operator_name")


def _unquote(s: str) -> str:
    """A string literal's text without its quotes, as the fact engine's default ``unquote`` gives it."""
    m = _QUOTED.match(s)
    return m.group(2) if m else s


def _enclosing_function(node: ts.Node) -> ts.Node | None:
    n = node.parent
    while n is not None and n.type != "function_definition":
        n = n.parent
    return n


def _function_name(fn: ts.Node) -> str:
    """The name a fact's ``scope = "function:NAME"`` matches for this definition."""
    name = fn.child_by_field_name("name")  # python
    if name is not None:
        return syntax.text(name)
    decl = fn.child_by_field_name("declarator")
    while decl is not None and decl.type not in _DECLARATORS:
        decl = decl.child_by_field_name("declarator")
    return syntax.text(decl) if decl is not None else ""


# Member: (kind, ctx, raw key, line, value or "")
Member = tuple[str, str, str, int, str]


@dataclass
class _Compiled:
    query: ts.Query
    kinds: list[Kind]  # per pattern index
    ctx_re: dict[str, re.Pattern]


_compiled: dict[str, _Compiled] = {}
_compile_lock = threading.Lock()


def _compile(lang: str) -> _Compiled:
    hit = _compiled.get(lang)
    if hit is not None:
        return hit
    parts: list[str] = []
    owners: list[Kind] = []
    for kind in KINDS:
        if lang not in kind.langs or not kind.pattern:  # a kind read by a regex (includes) has no query
            continue
        for pattern in query_text(kind, None, lang).split("\n"):
            parts.append(pattern)
            owners.append(kind)
    query = ts.Query(syntax.language(lang), "\n".join(parts))
    ctx_re = {k.name: re.compile(k.ctx_filter) for k in KINDS if k.ctx_filter}
    out = _Compiled(query, owners, ctx_re)
    with _compile_lock:
        _compiled[lang] = out
    return out


# Bytes without which no C-family pattern can match: most kernel files (SIMD loops, numeric tables) have none,
# and skipping their parse is most of inference's speed. One hint per kind: enum and case as words, tables
# and maps by ``] = {``/``] = "``, count locals by ``num_x = 1``, registrations by ``name("``.
_C_WORDS = (b"enum", b"case")
# Each starts with a literal, so re scans for it at C speed; one alternation of them all would not.
_C_FAST = tuple(re.compile(p) for p in (
    rb"\]\s*=\s*\{\s*[A-Za-z_\"{]", rb"\]\s*=\s*\"", rb"num_\w+\s*=\s*\d", rb"register\w*\s*\(\s*\"",
    rb"def\w*\s*\(\s*\"", rb"impl\w*\s*\(\s*\"", rb"define\w*\s*\(\s*\"", rb"custom_op\w*\s*\(\s*\"",
    rb"_op\w*\s*\(\s*\"", rb"host_name\s*\(\s*\"", rb"[=\w]\s*\{\s*\{?\s*\"",
))
# A call handing a constant first (``register_task_variant(TASK_RMSNORM, code)``): a definition holding one is worth
# parsing only when its callee gets at least _C_EQ_MIN distinct constants in the file (mine.named_constants' premise).
_CALL_CONST = re.compile(rb"\(\s*([A-Z][A-Z0-9]*_[A-Z0-9_]*[A-Z0-9])\s*[,)]")


def _word(piece: bytes, word: bytes) -> bool:
    """``word`` as a whole word: ``bytes.find`` for the scan, a boundary check per hit."""
    i = piece.find(word)
    while i >= 0:
        before = piece[i - 1 : i]
        after = piece[i + len(word) : i + len(word) + 1]
        if not (before.isalnum() or before == b"_") and not (after.isalnum() or after == b"_"):
            return True
        i = piece.find(word, i + 1)
    return False


# A comparison chain is a family only from four constants on: fewer ``== CONST`` in a definition is a plain test.
_C_EQ = re.compile(rb"==\s*[A-Z][A-Z0-9_]*[A-Z0-9]\b")
_C_EQ_MIN = 4


def _chain(piece: bytes) -> bool:
    """Whether ``piece`` compares with at least ``_C_EQ_MIN`` constants (``bytes.count`` first: most code has few)."""
    if piece.count(b"==") < _C_EQ_MIN:
        return False
    n = 0
    for _ in _C_EQ.finditer(piece):
        n += 1
        if n >= _C_EQ_MIN:
            return True
    return False


_C_STR_EQ = re.compile(rb'==\s*"')


def _string_chain(piece: bytes) -> bool:
    """Whether ``piece`` compares with at least ``_C_EQ_MIN`` string literals (``name == "linear"``)."""
    return piece.count(b'"') >= 2 * _C_EQ_MIN and len(_C_STR_EQ.findall(piece)) >= _C_EQ_MIN


def _hint(data: bytes, start: int = 0, end: int | None = None) -> bool:
    """Whether ``data[start:end]`` can hold a C-family member."""
    piece = data[start:end] if start or end is not None else data
    return (any(_word(piece, w) for w in _C_WORDS) or any(r.search(piece) for r in _C_FAST) or _chain(piece)
            or _string_chain(piece))


def _handing(data: bytes) -> tuple[bytes, ...]:
    """Lower-case callees handed at least ``_C_EQ_MIN`` distinct constants as their first argument in ``data``."""
    by: dict[bytes, set[bytes]] = {}
    for m in _CALL_CONST.finditer(data):
        j = m.start()
        while j > 0 and data[j - 1 : j] in (b" ", b"\t"):
            j -= 1
        i = j
        while i > 0 and (data[i - 1 : i].isalnum() or data[i - 1 : i] == b"_"):
            i -= 1
        name = data[i:j]
        if name and (name[:1].islower() or name[:1] == b"_"):
            by.setdefault(name, set()).add(m.group(1))
    return tuple(n + b"(" for n, consts in by.items() if len(consts) >= _C_EQ_MIN)


def may_hold(lang: str, data: bytes) -> bool:
    return lang == "python" or _hint(data) or bool(_handing(data))


_TOP_END = re.compile(rb"(?m)^\}[^\n]*\n")  # a definition's closing brace in column 0


def chunks(lang: str, data: bytes) -> list[tuple[int, bytes]]:
    """(first line - 1, text) of the parts of a file worth parsing.

    A C-family file is cut after every column-0 ``}`` (the end of a top-level definition) and only
    the definitions holding a hint are parsed: an enum, a switch or a table sits inside one
    definition, so its members, lines and enclosing function are what a whole-file parse gives.
    """
    if lang == "python":
        return [(0, data)]
    out: list[tuple[int, bytes]] = []
    pos = line = 0
    handing = _handing(data)

    def worth(piece: bytes) -> bool:
        return _hint(piece) or any(c in piece for c in handing)

    for m in _TOP_END.finditer(data):
        piece = data[pos : m.end()]
        if worth(piece):
            out.append((line, piece))
        line += piece.count(b"\n")
        pos = m.end()
    if pos < len(data) and worth(data[pos:]):
        out.append((line, data[pos:]))
    return out


# CMake names sources as bare or quoted words: ``add_library(x csrc/norm.cu ${DIR}/act.cu)``. The file's name is
# the word after its last ``/``; a name built from a variable (``${N}.cu``) is none.
CMAKE_SOURCE = r"(?:^|(?<=[\s\"'(]))(?:[\w.${}-]*/)*(?P<key>[\w-]+)\.(?:" + "|".join(SRC_EXTS) + r")(?=[\s\"')]|$)"
_CMAKE_RE = re.compile(CMAKE_SOURCE, re.M)


def _cmake_members(data: bytes) -> list[Member]:
    text = data.decode("utf-8", "replace")
    out: list[Member] = []
    for m in _CMAKE_RE.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        if "#" in text[start : m.start()]:
            continue  # a comment
        out.append(("src-file", "<module>", m.group(0), text.count("\n", 0, m.start()) + 1, ""))
    return out


_CDEF_ENUM = re.compile(r"(?m)^([ \t]*)c(?:p?def|typedef)[ \t]+(?:extern[ \t]+)?enum[ \t]+(?:class[ \t]+)?(\w+)[ \t]*:[ \t]*(?:#[^\n]*)?$")
_CDEF_MEMBER = re.compile(r"^([ \t]+)([A-Za-z_]\w*)[ \t]*(?:=[^\n#]*)?,?[ \t]*(?:#.*)?$")


def cython_enum_regex(prefix: str) -> str:
    """The regex fact reading one Cython enum's members at head: indented names starting with its prefix."""
    return r"(?m)^[ \t]+(?P<key>" + re.escape(prefix) + r"\w*)[ \t]*(?:=[^\n#]*)?,?[ \t]*(?:#[^\n]*)?$"


def _cython_members(data: bytes) -> list[Member]:
    """Members of each ``cdef enum NAME:`` block: the indented ``NAME [= value][,]`` lines under it."""
    lines = data.decode("utf-8", "replace").split("\n")
    out: list[Member] = []
    i = 0
    while i < len(lines):
        m = _CDEF_ENUM.match(lines[i])
        i += 1
        if not m:
            continue
        indent, name = len(m.group(1).expandtabs()), m.group(2)
        while i < len(lines):
            line = lines[i]
            if not line.strip() or line.strip().startswith("#"):
                i += 1
                continue
            mm = _CDEF_MEMBER.match(line)
            if mm is None or len(mm.group(1).expandtabs()) <= indent:
                break
            out.append(("pyx-enum", name, mm.group(2), i + 1, ""))
            i += 1
    return out


INCLUDE_REGEX = r'(?m)^[ \t]*#[ \t]*include[ \t]*"(?:[^"\n]*/)?(?P<key>[A-Za-z_][\w-]*)[^"/\n]*"'
_INCLUDE_RE = re.compile(INCLUDE_REGEX.encode())


def _includes(data: bytes) -> list[Member]:
    if b"include" not in data:
        return []
    out: list[Member] = []
    line, at = 1, 0
    for m in _INCLUDE_RE.finditer(data):
        line += data.count(b"\n", at, m.start())  # matches come in order: count from the previous one
        at = m.start()
        out.append(("c-include", "<module>", m.group("key").decode("utf-8", "replace"), line, ""))
    return out


def members(lang: str, data: bytes, limit: int = MAX_BYTES) -> list[Member]:
    """Every family member one file holds, as plain tuples (picklable, cacheable)."""
    if lang in _C and len(data) <= limit:
        return _members_of(lang, data, limit) + _includes(data)
    return _members_of(lang, data, limit)


def _members_of(lang: str, data: bytes, limit: int) -> list[Member]:
    if lang == "cython":
        return _cython_members(data) if len(data) <= limit else []
    if lang == "cmake":
        return _cmake_members(data) if len(data) <= limit else []
    if len(data) > limit or not may_hold(lang, data):
        return []
    out: list[Member] = []
    for offset, piece in chunks(lang, data):
        out += _members(lang, piece, offset)
    return out


def _members(lang: str, data: bytes, offset: int) -> list[Member]:
    c = _compile(lang)
    root = syntax.parse(lang, data).root_node
    out: list[Member] = []
    seen: set[tuple[str, int]] = set()
    for index, caps in ts.QueryCursor(c.query).matches(root):
        kind = c.kinds[index]
        keys = caps.get("key")
        if not keys:
            continue
        node = keys[0]
        if kind.fn_key:
            fn = _enclosing_function(node)
            ctx_nodes = caps.get("_ctx")
            if fn is None or not ctx_nodes:
                continue
            ctx = syntax.text(ctx_nodes[0])
            if kind.ctx_filter and not c.ctx_re[kind.name].search(ctx):
                continue
            out.append((kind.name, ctx, _function_name(fn), node.start_point[0] + 1 + offset, syntax.text(node)))
            continue
        if kind.whole_file:
            ctx = "<module>"
        elif kind.scope:
            fn = _enclosing_function(node)
            if fn is None:
                continue
            ctx = _function_name(fn)
        else:
            ctx_nodes = caps.get("_ctx")
            if not ctx_nodes:
                continue
            ctx = syntax.text(ctx_nodes[0])
        if kind.ctx_filter and not c.ctx_re[kind.name].search(ctx):
            continue
        if kind.name == "array" and _enclosing_function(node) is not None:
            continue  # a local array is scratch, not a registry
        if (kind.name, node.start_byte) in seen:
            continue
        seen.add((kind.name, node.start_byte))
        value = ""
        if kind.values and caps.get("value"):
            value = syntax.text(caps["value"][0])
        elif kind.name == "case" and node.parent is not None and node.parent.type == "case_statement":
            value = _case_body(node.parent, node)
        elif kind.name == "enum":
            owner = _owner_class(node)
            value = f"{OWNER}{owner}" if owner else ""
        elif kind.name == "c-num-case":  # the function whose switch it is: the fact's scope
            fn = _enclosing_function(node)
            if fn is None:
                continue
            value = _function_name(fn)
        out.append((kind.name, ctx, _unquote(syntax.text(node).strip()), node.start_point[0] + 1 + offset, value))
    return out


_BOOLS = ("true", "false")
OWNER = "@in:"  # an enum member's value: the class or struct whose body declares the enum ("" at namespace level)


def _owner_class(node: ts.Node) -> str:
    """The class or struct whose body holds this enum (a kernel's private TMEM layout), else ""."""
    n = node.parent
    while n is not None:
        if n.type == "function_definition":
            return ""
        if n.type == "field_declaration_list" and n.parent is not None:
            name = n.parent.child_by_field_name("name")
            return syntax.text(name) if name is not None else ""
        n = n.parent
    return ""


def _case_body(case: ts.Node, label: ts.Node) -> str:
    """What a ``case`` does: "bool" (only returns true, false or a test), "fall" (nothing: falls through), else "".

    A switch whose every case returns a constant is a predicate (``supports_reorder``): a list of features, where
    two lists agreeing says less than a predicate agreeing with the dispatch it guards.
    """
    body = [c for c in case.named_children if c.id != label.id and c.type != "comment"]
    if len(body) == 1 and body[0].type == "compound_statement":
        body = [c for c in body[0].named_children if c.type != "comment"]
    if not body:
        return "fall"
    for stmt in body:
        kids = [c for c in stmt.named_children if c.type != "comment"]
        if stmt.type != "return_statement" or len(kids) != 1 or not _condition(kids[0]):
            return ""
    return "bool"


_TESTS = {"!", "==", "!=", "<", ">", "<=", ">=", "&&", "||"}


def _condition(node: ts.Node) -> bool:
    """``true``, ``false`` or a test (``!flag``, ``a == b``, ``x && y``): what a predicate returns."""
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    if node.type in _BOOLS:
        return True
    op = node.child_by_field_name("operator")
    return node.type in ("unary_expression", "binary_expression") and op is not None and op.type in _TESTS


# --------------------------------------------------------------------------- a tree's members, cached


@dataclass
class FileMembers:
    path: str
    lang: str
    blob: str
    members: list[Member] = field(default_factory=list)


class BlobCache:
    """Members per blob SHA, in memory and (when ``directory`` is given) in one pickle on disk."""

    def __init__(self, directory: Path | None):
        self.path = directory / f"members-v{VERSION}.pickle" if directory else None
        self.data: dict[str, list[Member]] = {}
        self.dirty = False
        if self.path is not None and self.path.is_file():
            try:
                with self.path.open("rb") as fh:
                    loaded = pickle.load(fh)
                if isinstance(loaded, dict):
                    self.data = loaded
            except Exception:  # a torn or foreign cache file is rebuilt, never trusted
                self.data = {}

    def save(self, keep: set[str] | None = None) -> None:
        """Write the cache; past ``MAX_CACHED`` blobs only those in ``keep`` (the tree just read) stay."""
        if self.path is None or not self.dirty:
            return
        if keep is not None and len(self.data) > MAX_CACHED:
            self.data = {b: m for b, m in self.data.items() if b in keep}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            with tmp.open("wb") as fh:
                pickle.dump(self.data, fh, protocol=pickle.HIGHEST_PROTOCOL)
            tmp.replace(self.path)
            self.dirty = False
        except OSError:
            pass  # a read-only cache dir costs speed, never correctness


_memory: dict[str, list[Member]] = {}

# Files inference reads with a grammar of a language they extend: Metal is C++14 with attributes and address
# spaces, which tree-sitter-cpp parses well enough for tables, enums, switches and [[host_name(...)]].
INFER_EXT = {".metal": "cpp"}
METAL_MAX_BYTES = 2_000_000  # one shader library per backend, written by hand


def lang_for(path: str) -> str | None:
    """The grammar inference reads ``path`` with; "cmake" for CMake files (read by a regex, for source lists)."""
    name = path.rsplit("/", 1)[-1]
    if name == "CMakeLists.txt" or name.endswith(".cmake"):
        return "cmake"
    if name.endswith((".pxd", ".pyx", ".pxi")):
        return "cython"
    lang = syntax.lang_for_path(path)
    if lang is None and "." in path:
        lang = INFER_EXT.get(path[path.rfind("."):].lower())
    return lang


def source_files(tree) -> list[tuple[str, str, str]]:
    """(path, lang, blob) of every file a grammar reads, vendored and generated trees left out."""
    out = []
    for path in tree.paths():
        lang = lang_for(path)
        if lang is None or _vendored(path):
            continue
        blob = tree.blob_sha(path)
        if blob:
            out.append((path, lang, blob))
    return out


# Vendored and generated trees say nothing about this code's beliefs; tests, examples and benchmarks lag the code on
# purpose (a benchmark script's table headers are copied, not kept in step).
_VENDORED = re.compile(
    r"(^|/)(third_party|3rdparty|vendor|vendors|external|extern|deps|node_modules|build|dist|tests?|examples?|"
    r"benchmarks?)/"
    r"|(^|/)(test_[^/]*|[^/]*_test)\.py$"
)


def _vendored(path: str) -> bool:
    return bool(_VENDORED.search(path))


def tree_members(tree, cache: BlobCache, workers: int | None = None) -> list[FileMembers]:
    """Members of every source file of ``tree``; only blobs no cache holds are read and parsed."""
    files = source_files(tree)
    todo = [(p, lang, b) for p, lang, b in files if b not in _memory and b not in cache.data]
    if todo:
        data = read_blobs(str(tree.repo_path), [b for _, _, b in todo])
        jobs = [(lang, b, data.get(b, b""), METAL_MAX_BYTES if p.endswith(".metal") else MAX_BYTES)
                for p, lang, b in todo]
        for blob, got in _run(jobs, workers):
            cache.data[blob] = got
            cache.dirty = True
    out = []
    for path, lang, blob in files:
        hit = _memory.get(blob)
        if hit is None:
            hit = _memory[blob] = cache.data[blob]
        out.append(FileMembers(path, lang, blob, hit))
    if len(_memory) > 200_000:
        _memory.clear()
    return out


def _one(job: tuple[str, str, bytes, int]) -> tuple[str, list[Member]]:
    lang, blob, data, limit = job
    try:
        return blob, members(lang, data, limit)
    except Exception:  # one unreadable file must not stop inference over the rest
        return blob, []


def _run(jobs: list[tuple[str, str, bytes, int]], workers: int | None) -> Iterable[tuple[str, list[Member]]]:
    """Parse in worker processes when there is enough to parse; forked workers share the grammars."""
    n = workers if workers is not None else min(os.cpu_count() or 1, 4)
    size = sum(len(d) for _, _, d, _ in jobs)
    if n <= 1 or size < 2_000_000 or not hasattr(os, "fork"):
        return map(_one, jobs)
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(n) as pool:
        return pool.map(_one, jobs, chunksize=max(1, len(jobs) // (n * 8)))

