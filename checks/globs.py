"""Gitignore-style path globs (``**`` spans directories), compiled once and shared by every stage."""

from __future__ import annotations

from functools import lru_cache

import pathspec


@lru_cache(maxsize=4096)
def _spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    return pathspec.PathSpec.from_lines("gitignore", patterns)


def compile_globs(patterns: list[str] | tuple[str, ...] | str) -> pathspec.PathSpec:
    return _spec((patterns,) if isinstance(patterns, str) else tuple(patterns))


def matches(patterns: list[str] | tuple[str, ...] | str, path: str) -> bool:
    return compile_globs(patterns).match_file(path)
