"""Load the stage dataclasses on machines that only have torch and triton.

A GPU runner image carries torch/triton but not cattrs. ``checks.model`` uses a
cattrs ``Converter`` for its JSON round trip; when cattrs is missing this module
provides a small stand-in covering exactly the types the stage dataclasses use
(dataclasses, lists, dicts, optionals, literals, scalars), so
``drift-audit runner execute`` reads a TestPlan and writes Results anywhere.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from functools import cache
from typing import Any, Literal, Union


def unstructure(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: unstructure(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [unstructure(x) for x in obj]
    if isinstance(obj, dict):
        return {k: unstructure(v) for k, v in obj.items()}
    return obj


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def structure(data: Any, tp: Any) -> Any:
    """Build ``tp`` from plain JSON data; raises ValueError naming the first bad value."""
    if tp is Any:
        return data
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None:
            if type(None) in args:
                return None
            raise ValueError(f"expected {tp}, got null")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return structure(data, arg)
            except (ValueError, TypeError) as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors))
    if origin is Literal:
        if data not in typing.get_args(tp):
            raise ValueError(f"{data!r} is not one of {typing.get_args(tp)}")
        return data
    if origin is list:
        if not isinstance(data, list):
            raise ValueError(f"expected a list, got {type(data).__name__}")
        (inner,) = typing.get_args(tp) or (Any,)
        return [structure(x, inner) for x in data]
    if origin is dict:
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        _, inner = typing.get_args(tp) or (str, Any)
        return {k: structure(v, inner) for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise ValueError(f"expected an object for {tp.__name__}, got {type(data).__name__}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if not f.init:
                continue
            if f.name in data:
                try:
                    kwargs[f.name] = structure(data[f.name], hints[f.name])
                except ValueError as exc:
                    raise ValueError(f"{tp.__name__}.{f.name}: {exc}") from None
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{tp.__name__}: missing required field '{f.name}'")
        return tp(**kwargs)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise ValueError(f"expected a number, got {data!r}")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise ValueError(f"expected {tp.__name__}, got {data!r}")
        return data
    return data


class Converter:
    """The part of ``cattrs.Converter`` that ``checks.model`` uses."""

    def __init__(self, **_options: Any):
        pass

    def unstructure(self, obj: Any) -> Any:
        return unstructure(obj)

    def structure(self, data: Any, cls: Any) -> Any:
        return structure(data, cls)


def _install_shim() -> None:
    shim = types.ModuleType("cattrs")
    shim.__doc__ = "Stand-in for cattrs provided by runner.compat (cattrs is not installed here)."
    shim.Converter = Converter  # type: ignore[attr-defined]
    shim.DRIFT_AUDIT_SHIM = True  # type: ignore[attr-defined]
    sys.modules["cattrs"] = shim


def model() -> types.ModuleType:
    """``checks.model``, importable with or without cattrs."""
    if "checks.model" in sys.modules:
        return sys.modules["checks.model"]
    try:
        import cattrs  # noqa: F401
    except ImportError:
        _install_shim()
    import checks.model as m

    return m
