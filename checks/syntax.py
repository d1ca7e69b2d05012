"""Tree-sitter parsing shared by pillars and facts, cached by blob SHA.

Base and head share most blobs, so a parse keyed by blob SHA is reused across
both sides of an audit and across audits in one process.
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import PurePosixPath

import tree_sitter as ts

# Extension → grammar. CUDA's grammar is a superset of C++, so .cu/.cuh get it.
_EXT_LANG = {
    ".py": "python",
    ".pyi": "python",
    ".c": "c",
    ".h": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".cu": "cuda",
    ".cuh": "cuda",
}

LANGS = ("python", "c", "cpp", "cuda")


def lang_for_path(path: str) -> str | None:
    return _EXT_LANG.get(PurePosixPath(path).suffix.lower())


@cache
def language(name: str) -> ts.Language:
    import importlib

    if name not in LANGS:
        raise ValueError(f"no tree-sitter grammar for '{name}'; use one of {', '.join(LANGS)}")
    return ts.Language(importlib.import_module(f"tree_sitter_{name}").language())


_local = threading.local()


def _parser(name: str) -> ts.Parser:
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    if name not in parsers:
        parsers[name] = ts.Parser(language(name))
    return parsers[name]


_cache: dict[tuple[str, str], ts.Tree] = {}
_cache_lock = threading.Lock()
_CACHE_MAX = 20000


def parse(lang: str, data: bytes, key: str | None = None) -> ts.Tree:
    """Parse ``data``; with ``key`` (a blob SHA) the tree is cached and shared."""
    if key is not None:
        hit = _cache.get((lang, key))
        if hit is not None:
            return hit
    tree = _parser(lang).parse(data)
    if key is not None:
        with _cache_lock:
            if len(_cache) >= _CACHE_MAX:
                _cache.clear()
            _cache[(lang, key)] = tree
    return tree


def text(node: ts.Node) -> str:
    return node.text.decode("utf-8", "replace") if node.text is not None else ""
