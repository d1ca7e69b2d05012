"""Blank the C/C++/CUDA macro forms tree-sitter cannot parse, keeping every byte offset and line.

Kernel code is macro-heavy (``CUTLASS_DEVICE static void f(...)``,
``extern __shared__ __align__(1024) uint8_t smem[]``, ``CUTLASS_PRAGMA_UNROLL``
before a loop, ``#if`` branches with one brace each). The grammars see those
as errors, which costs rows near them and miscounts parameters. Without the
repo's macro definitions nothing can be expanded, but the forms that are only
attributes can be dropped: each such byte becomes a space (newlines stay), so
rows keep their lines and columns and captured text stays the source's text.

What is blanked:
- ``__align__(n)``, ``__cluster_dims__(...)``, ``__maxnreg__(...)`` (the grammar reads ``__launch_bounds__``);
- attribute-like macros: an ALL_CAPS name ending ``_DEVICE``, ``_HOST``, ``_GLOBAL``,
  ``_INLINE``, ``_FORCEINLINE``, ``_NOINLINE``, ``_KERNEL``, ``_API``, ``_EXPORT``,
  ``_ALIGNAS(...)``, ``_UNROLL`` or ``_CONSTANT``, and names this file ``#define``s as
  empty or as attributes only (``#define DEVICE_FN __device__ __forceinline__``);
- a line that is only an ALL_CAPS macro call with no ``;`` (``DEFINE_OP(rms)``);
- conditional directives: ``#if``/``#ifdef``/``#ifndef``/``#endif`` lines, and every
  ``#elif``/``#else`` branch, so the first branch reads as plain code;
- for ``lang = "c"``/``"cpp"`` (a CUDA header read with the C++ grammar), the CUDA keywords
  ``__device__``, ``__host__``, ``__global__``, ``__constant__``, ``__shared__``, ``__managed__``,
  ``__forceinline__``, ``__noinline__``, ``__restrict__``, ``__grid_constant__`` and
  ``__launch_bounds__(...)``, which only the CUDA grammar reads.
"""

from __future__ import annotations

import re

_PAREN_ATTRS = re.compile(rb"__(?:align|cluster_dims|maxnreg)__\s*\(")
_SUFFIX = rb"(?:DEVICE|HOST|HOST_DEVICE|DEVICE_FUNC|GLOBAL|INLINE|FORCEINLINE|FORCE_INLINE|NOINLINE|KERNEL|API|EXPORT|UNROLL|CONSTANT)"
_ATTR_TAIL = re.compile(rb"_" + _SUFFIX + rb"\b")  # found by its tail: a literal '_' is a fast regex start
_ALIGNAS = re.compile(rb"_ALIGNAS\s*\(")
_DEFINE = re.compile(rb"#[ \t]*define[ \t]+([A-Za-z_]\w*)([^\n]*)")
_ATTR_WORDS = {b"__device__", b"__host__", b"__global__", b"__forceinline__", b"__noinline__", b"inline",
               b"static", b"__inline__", b"__attribute__((always_inline))", b"[[nodiscard]]", b"constexpr"}
_CALL_LINE = re.compile(rb"\n([ \t]*)([A-Z][A-Z0-9]*_[A-Z0-9_]*)[ \t]*(\([^\n;]*\))[ \t]*(?=\n)")
_STATEMENT_END = re.compile(rb"(?:[;{}]|\*/|^[ \t]*#.*|^[ \t]*//.*|^)[ \t]*$")
_DIRECTIVE = re.compile(rb"#[ \t]*(if|ifdef|ifndef|elif|elifdef|elifndef|else|endif)\b")


def _blank(buf: bytearray, start: int, end: int) -> None:
    for i in range(start, end):
        if buf[i] not in (10, 13):
            buf[i] = 32


def _at_line_start(data: bytes, at: int) -> bool:
    """Only blanks between the line start and ``at``: a directive, not a ``#`` inside code."""
    begin = data.rfind(b"\n", 0, at) + 1
    return not data[begin:at].strip()


def _name_start(data: bytes, end: int) -> int:
    """Start of the ALL_CAPS name that ends at ``end``; ``end`` itself when there is none."""
    start = end
    while start > 0 and (65 <= data[start - 1] <= 90 or 48 <= data[start - 1] <= 57 or data[start - 1] == 95):
        start -= 1
    while start < end and not 65 <= data[start] <= 90:  # a name starts with a capital letter
        start += 1
    if start > 0 and (97 <= data[start - 1] <= 122):  # part of a lower-case identifier: not a macro
        return end
    return start


def _close(data: bytes, open_at: int) -> int:
    """Index after the parenthesis that closes the one at ``open_at``; ``open_at + 1`` if unbalanced."""
    depth = 0
    for i in range(open_at, min(len(data), open_at + 4000)):
        c = data[i]
        if c == 40:
            depth += 1
        elif c == 41:
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == 10 and depth == 0:
            break
    return open_at + 1


def _local_attr_macros(data: bytes) -> list[bytes]:
    names = []
    for m in _DEFINE.finditer(data):
        if not _at_line_start(data, m.start()):
            continue
        name, body = m.group(1), m.group(2).strip()
        if name.endswith(b"_H") or name.endswith(b"_H_") or name.endswith(b"_HPP"):
            continue  # include guards
        words = body.split()
        if not words or all(w in _ATTR_WORDS for w in words):
            names.append(name)
    return names


def _conditionals(data: bytes, buf: bytearray) -> None:
    """Blank directive lines, and every branch but the first (the first but ``#if 0``'s), nesting respected."""
    stack: list[list[bool]] = []  # per open #if: [this branch is blanked, a kept branch was seen]
    region: int | None = None
    for m in _DIRECTIVE.finditer(data):
        if not _at_line_start(data, m.start()):
            continue
        kind = m.group(1)
        line_end = data.find(b"\n", m.start())
        while line_end != -1 and data[line_end - 1: line_end] == b"\\":  # a continued directive
            line_end = data.find(b"\n", line_end + 1)
        line_end = len(data) if line_end == -1 else line_end
        before = any(s[0] for s in stack)
        if kind in (b"if", b"ifdef", b"ifndef"):
            zero = kind == b"if" and data[m.end():line_end].strip() in (b"0", b"(0)", b"false")
            stack.append([zero, not zero])
        elif stack and kind == b"endif":
            stack.pop()
        elif stack:  # elif / else
            top = stack[-1]
            top[0] = top[1]
            top[1] = True
        after = any(s[0] for s in stack)
        if not before and after:
            region = line_end
        elif before and not after and region is not None:
            _blank(buf, region, m.start())
            region = None
        _blank(buf, m.start(), line_end)


def _previous_line(buf: bytearray, start: int) -> bytes:
    """The last non-blank line before ``start``."""
    end = start
    while end > 0:
        begin = buf.rfind(b"\n", 0, end - 1) + 1
        line = bytes(buf[begin:end - 1]) if end - 1 >= begin else b""
        if line.strip():
            return line
        if begin == 0:
            return b""
        end = begin
    return b""


_CUDA_WORDS = re.compile(rb"__(?:device|host|global|constant|shared|managed|forceinline|noinline|restrict|grid_constant)__")
_CUDA_PAREN = re.compile(rb"__launch_bounds__\s*\(")


def preprocess(data: bytes, lang: str = "cuda") -> bytes:
    """``data`` with unparseable macro forms replaced by spaces; same length, same newlines."""
    if b"__" not in data and b"#" not in data and not re.search(rb"[A-Z]_[A-Z]", data):
        return data
    buf = bytearray(data)
    if lang != "cuda" and b"__" in data:
        for m in _CUDA_WORDS.finditer(data):
            _blank(buf, m.start(), m.end())
        for m in _CUDA_PAREN.finditer(data):
            _blank(buf, m.start(), _close(data, m.end() - 1))
    for m in _PAREN_ATTRS.finditer(data):
        _blank(buf, m.start(), _close(data, m.end() - 1))
    for m in _ALIGNAS.finditer(data):
        _blank(buf, _name_start(data, m.start()), _close(data, m.end() - 1))
    for m in _ATTR_TAIL.finditer(data):
        start = _name_start(data, m.start())
        if start < m.start():
            _blank(buf, start, m.end())
    local = _local_attr_macros(data) if b"define" in data else []
    if local:
        words = re.compile(rb"\b(?:" + b"|".join(re.escape(n) for n in local) + rb")\b")
        define_lines = {m.start(1) for m in _DEFINE.finditer(data)}
        for m in words.finditer(data):
            if m.start() not in define_lines:
                _blank(buf, m.start(), m.end())
    for m in _CALL_LINE.finditer(b"\n" + bytes(buf)) if b"(" in data else ():  # offsets are one more
        prev = _previous_line(buf, m.start())
        if _STATEMENT_END.search(prev):  # a statement of its own, not an argument of a call above
            _blank(buf, m.start(2) - 1, m.end() - 1)
    if b"#" in data:
        _conditionals(data, buf)
    return bytes(buf)
