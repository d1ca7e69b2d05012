"""A webhook body → a validated payload, or a ``PayloadError`` that names the field (answered 400, never 500).

Validation is GitHub's own: the JSON Schemas GitHub publishes for webhook
payloads (octokit/webhooks, MIT), vendored in ``bot/schemas`` for every
event and action the bot acts on, so the service never depends on a checkout
or a fixtures folder. Each is compiled once to Python (fastjsonschema, refs
inlined), about 1 ms per pull_request payload. Two deliberate relaxations: ``additionalProperties:
false`` is dropped, because GitHub adds fields to payloads over time and a new
field must not turn deliveries into 400s; and string formats are not checked.
Events the bot reads without a published schema (``installation_repositories``)
and every field the bot reads are checked again by ``Fields``, the typed
accessor ``bot.events`` builds jobs with; that is also the fallback should a
schema be missing.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

MAX_DEPTH = 64  # GitHub's payloads nest about 8 deep; deeper is hostile and would recurse in validators
_MISSING = object()
_SURROGATE = re.compile("[\ud800-\udfff]")


class PayloadError(ValueError):
    """A payload the bot refuses: ``field`` is a JSON path such as ``$.pull_request.number``."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


def decode(body: bytes) -> dict[str, Any]:
    """A JSON object in UTF-8, nesting capped at ``MAX_DEPTH``, every string valid Unicode."""
    try:
        text = body.decode("utf-8")  # GitHub sends UTF-8; json.loads(bytes) would also guess UTF-16 and UTF-32
    except UnicodeDecodeError as exc:
        raise PayloadError("$", f"not UTF-8 ({str(exc)[:120]})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise PayloadError("$", f"nested deeper than {MAX_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError("$", f"not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise PayloadError("$", f"expected a JSON object, got {_type(data)}")
    _check_depth(data)
    return data


def _check_depth(data: Any) -> None:
    """Nesting capped, and every string (keys too) valid Unicode: JSON's ``\\ud800`` escape decodes to a lone
    surrogate, which GitHub never sends and which no UTF-8 sink (SQLite, the REST API, a log) can encode."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise PayloadError("$", f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            if any(_SURROGATE.search(k) for k in value):
                raise PayloadError("$", "an object key holds a lone surrogate (not valid Unicode)")
            items: Any = value.values()
        else:
            items = value
        for v in items:
            if isinstance(v, dict | list):
                stack.append((v, depth + 1))
            elif isinstance(v, str) and _SURROGATE.search(v):
                raise PayloadError("$", "a string holds a lone surrogate (not valid Unicode)")


def _type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


# --------------------------------------------------------------------------- GitHub's schemas


def _relaxed(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _relaxed(v)
            for k, v in node.items()
            if not (k == "additionalProperties" and v is False) and k not in ("format", "tsAdditionalProperties")
        }
    if isinstance(node, list):
        return [_relaxed(v) for v in node]
    return node


@lru_cache(maxsize=1)
def _documents() -> dict[str, dict]:
    docs = {}
    for entry in resources.files("bot.schemas").iterdir():
        if entry.name.endswith(".schema.json"):
            doc = _relaxed(json.loads(entry.read_text()))
            docs[doc["$id"]] = doc
    return docs


def _inline(node: Any, base: str, seen: frozenset[str]) -> Any:
    """The schema with every ``$ref`` replaced by the document it names (GitHub's schemas have no cycles), so it
    compiles to one plain validator with no lookups at validation time."""
    if isinstance(node, list):
        return [_inline(v, base, seen) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = ref if ref.startswith("common/") or not base.startswith("common/") else f"common/{ref}"
        if target in seen or target not in _documents():
            raise ValueError(f"schema {base}: cannot inline $ref {ref!r}")
        out = _inline(_documents()[target], target, seen | {target})
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {"allOf": [out, _inline(rest, base, seen)]} if rest else out
    return {k: _inline(v, base, seen) for k, v in node.items() if k not in ("$id", "$schema")}


@lru_cache(maxsize=64)
def _validator(schema_id: str) -> Any:
    """GitHub's schema compiled to Python (fastjsonschema): about 1 ms for a pull_request payload."""
    import fastjsonschema

    doc = _documents().get(schema_id)
    if doc is None:
        return None
    return fastjsonschema.compile(_inline(doc, schema_id, frozenset({schema_id})), use_formats=False)


def has_schema(event: str, action: str | None) -> bool:
    return _schema_id(event, action) in _documents()


def warm() -> None:
    """Compile every vendored schema now (about half a second each), not on the first delivery of its event."""
    for schema_id in _documents():
        if "$" in schema_id:
            _validator(schema_id)


def _schema_id(event: str, action: str | None) -> str:
    return f"{event}$event" if event == "ping" else f"{event}${action}"


def validate(event: str, action: str | None, payload: dict[str, Any]) -> None:
    """Raise ``PayloadError`` for the first violation of GitHub's schema for ``event.action``."""
    validator = _validator(_schema_id(event, action))
    if validator is None:
        return
    import fastjsonschema

    try:
        validator(payload)
    except fastjsonschema.JsonSchemaValueException as exc:
        path = [str(p) for p in (exc.path or ["data"])][1:]
        where = "$" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in path)
        problem = str(exc.message).removeprefix(str(exc.name)).strip() or "does not match GitHub's schema"
        raise PayloadError(where, f"{problem[:200]}, got {_type(exc.value)}") from None


# --------------------------------------------------------------------------- typed access


class Fields:
    """Typed reads of a payload: each ``get`` checks the type and names the path when it is wrong."""

    def __init__(self, payload: dict[str, Any], path: str = "$"):
        self.payload, self.path = payload, path

    def _walk(self, dotted: str) -> tuple[str, Any]:
        node: Any = self.payload
        where = self.path
        for part in dotted.split("."):
            if node is _MISSING or node is None:
                node = _MISSING
            elif not isinstance(node, dict):
                raise PayloadError(where, f"expected object, got {_type(node)}")
            else:
                node = node.get(part, _MISSING)
            where = f"{where}.{part}"
        return where, node

    def get(self, dotted: str, kind: type | tuple[type, ...], *, required: bool = True, default: Any = None) -> Any:
        where, value = self._walk(dotted)
        if value is _MISSING or value is None:
            if required:
                raise PayloadError(where, "required, missing or null")
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(_type(k()) if k in (bool, int, float, str, list, dict) else k.__name__ for k in kinds)
            raise PayloadError(where, f"expected {names}, got {_type(value)}")
        return value

    def obj(self, dotted: str, *, required: bool = True) -> Fields:
        value = self.get(dotted, dict, required=required, default={})
        return Fields(value, f"{self.path}.{dotted}")

    def items(self, dotted: str) -> list[Fields]:
        """Each object of an array (a missing array is empty)."""
        values = self.get(dotted, list, required=False, default=[])
        out = []
        for i, v in enumerate(values):
            if not isinstance(v, dict):
                raise PayloadError(f"{self.path}.{dotted}[{i}]", f"expected object, got {_type(v)}")
            out.append(Fields(v, f"{self.path}.{dotted}[{i}]"))
        return out
