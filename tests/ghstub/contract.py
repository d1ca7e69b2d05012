"""GitHub's published REST contract, checked on every request the stand-in serves.

The stand-in is only worth testing against if it is no more lenient than
GitHub. Each request is matched to its operation in GitHub's OpenAPI
description (``shared/fixtures/github-rest``, trimmed to the operations Drift
Audit uses), its query and JSON body are validated against the operation's
parameters and request schema, and each response body against the schema of
the status answered. A mismatch is a *violation*: a client bug when the
request is wrong, a stand-in bug when the response is. ``StubState`` keeps
them, and the ``ghstub`` fixture fails a test that leaves any behind.

OpenAPI 3.0 schemas are JSON Schema with ``nullable``; that one keyword is
rewritten (``type: [T, "null"]``) so a plain Draft 7 validator can check them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from referencing import Registry
from referencing.jsonschema import DRAFT7

_ROOT = Path(__file__).resolve().parents[2]
REST_FIXTURES = next(
    (
        p
        for p in (
            _ROOT.parent / "shared" / "fixtures" / "github-rest",
            _ROOT / ".shared-fixtures" / "github-rest",  # the copy sent with a checkout that travels alone
            Path("/work/shared/fixtures/github-rest"),
        )
        if p.is_dir()
    ),
    _ROOT.parent / "shared" / "fixtures" / "github-rest",
)
SPEC_FILE = REST_FIXTURES / "api.github.com.trimmed.json"
_DOC_URI = "urn:github-rest"
# Error answers GitHub gives on any operation, documented or not: auth, rate limits, outages.
_ERROR_BODY = {
    "type": "object",
    "required": ["message"],
    "properties": {"message": {"type": "string"}, "documentation_url": {"type": "string"}},
}


def _nullable(node: Any) -> Any:
    """OpenAPI 3.0 ``nullable: true`` → JSON Schema that also admits ``null``."""
    if isinstance(node, list):
        return [_nullable(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        if "type" in out and "$ref" not in out:
            out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


@dataclass
class Operation:
    """One path + method of the description, with its compiled validators."""

    id: str
    method: str
    template: str
    pattern: re.Pattern[str]
    query: dict[str, dict] = field(default_factory=dict)  # name -> parameter schema
    required_query: set[str] = field(default_factory=set)
    body: Draft7Validator | None = None
    body_required: bool = False
    responses: dict[str, Draft7Validator | None] = field(default_factory=dict)  # status -> body validator


@dataclass
class Violation:
    operation: str
    where: str  # "request" (the client broke the contract) or "response" (the stand-in did)
    detail: str

    def __str__(self) -> str:
        return f"{self.operation} {self.where}: {self.detail}"


class Contract:
    """Operations of GitHub's REST description, matched by method and path."""

    def __init__(self, spec: dict):
        self.spec = _nullable(spec)
        self.registry: Registry = Registry().with_resource(_DOC_URI, DRAFT7.create_resource(self.spec))
        self.operations: list[Operation] = []
        for template, item in self.spec["paths"].items():
            shared = item.get("parameters", [])
            for method, op in item.items():
                if method == "parameters":
                    continue
                self.operations.append(self._operation(template, method, op, shared))

    def _validator(self, *parts: str) -> Draft7Validator:
        return Draft7Validator({"$ref": _DOC_URI + _pointer(*parts)}, registry=self.registry)

    def _resolve(self, node: dict) -> dict:
        while "$ref" in node:
            node = self.registry.resolver(_DOC_URI).lookup(_DOC_URI + node["$ref"]).contents
        return node

    def _operation(self, template: str, method: str, op: dict, shared: list) -> Operation:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template))
        o = Operation(op["operationId"], method.upper(), template, re.compile(f"^{regex}/?$"))
        for param in [*shared, *op.get("parameters", [])]:
            param = self._resolve(param)
            if param["in"] == "query":
                o.query[param["name"]] = param.get("schema", {})
                if param.get("required"):
                    o.required_query.add(param["name"])
        body = op.get("requestBody")
        if body is not None:
            body = self._resolve(body)
            if "application/json" in body.get("content", {}):
                o.body = self._validator("paths", template, method, "requestBody", "content", "application/json", "schema")
                o.body_required = bool(body.get("required"))
        for status, resp in op.get("responses", {}).items():
            resp = self._resolve(resp)
            content = resp.get("content", {})
            if "application/json" in content and "schema" in content["application/json"]:
                ref = op["responses"][status]
                if "$ref" in ref:  # a shared response: validate against its own schema
                    name = ref["$ref"].rsplit("/", 1)[-1]
                    o.responses[status] = self._validator(
                        "components", "responses", name, "content", "application/json", "schema"
                    )
                else:
                    o.responses[status] = self._validator(
                        "paths", template, method, "responses", status, "content", "application/json", "schema"
                    )
            else:
                o.responses[status] = None
        return o

    def match(self, method: str, api_path: str) -> Operation | None:
        for op in self.operations:
            if op.method == method and op.pattern.match(api_path):
                return op
        return None

    # ------------------------------------------------------------------ checks

    def check_request(self, op: Operation, query: Mapping[str, str], body: Any) -> list[Violation]:
        found = []
        for name in sorted(op.required_query - set(query)):
            found.append(Violation(op.id, "request", f"query parameter '{name}' is required"))
        for name, raw in query.items():
            schema = op.query.get(name)
            if schema is None:
                continue  # GitHub ignores query parameters it does not know
            value = _coerce(raw, schema)
            for err in Draft7Validator(schema).iter_errors(value):
                found.append(Violation(op.id, "request", f"query parameter '{name}'={raw!r}: {err.message}"))
        if op.body is not None:
            if body is None:
                if op.body_required:
                    found.append(Violation(op.id, "request", "a JSON body is required"))
            else:
                found += [
                    Violation(op.id, "request", f"body{_at(err.absolute_path)}: {_message(err)}")
                    for err in op.body.iter_errors(body)
                ]
        elif body not in (None, {}, b""):
            found.append(Violation(op.id, "request", "this operation takes no request body"))
        return found

    def check_response(self, op: Operation, status: int, body: Any) -> list[Violation]:
        key = str(status)
        if key not in op.responses:
            if status >= 400:  # undocumented errors (401, 403/429 limits, 5xx) still carry GitHub's error body
                return [
                    Violation(op.id, "response", f"{status} body{_at(e.absolute_path)}: {_message(e)}")
                    for e in Draft7Validator(_ERROR_BODY).iter_errors(body)
                ]
            return [Violation(op.id, "response", f"status {status} is not a documented answer")]
        validator = op.responses[key]
        if validator is None or body is None:
            return []
        return [
            Violation(op.id, "response", f"{status} body{_at(e.absolute_path)}: {_message(e)}")
            for e in validator.iter_errors(body)
        ]


def _message(err) -> str:
    """jsonschema's message without the whole offending value (an array of 51 annotations, a 1 MB string)."""
    short = {"maxItems": "has more than {} items", "maxLength": "is longer than {} characters",
             "maxProperties": "has more than {} properties", "enum": "is not one of {}"}
    if err.validator in short:
        return f"{str(err.instance)[:60]!s} {short[err.validator].format(err.validator_value)}"
    return err.message[:300]


def _at(path) -> str:
    parts = list(path)
    return ("." + ".".join(str(p) for p in parts)) if parts else ""


def _coerce(raw: str, schema: dict) -> Any:
    """Query strings are text; compare them with the parameter's declared type."""
    kind = schema.get("type")
    try:
        if kind == "integer":
            return int(raw)
        if kind == "number":
            return float(raw)
        if kind == "boolean":
            return {"true": True, "false": False}.get(raw, raw)
    except ValueError:
        return raw
    return raw


@cache
def contract() -> Contract:
    """The description, parsed once per process (compiling it is the slow part)."""
    if not SPEC_FILE.is_file():
        raise FileNotFoundError(
            f"{SPEC_FILE}: GitHub's REST description is missing; the stand-in validates against it "
            "(expected in shared/fixtures/github-rest beside the checkout)"
        )
    return Contract(json.loads(SPEC_FILE.read_text()))
