"""The API's OpenAPI document, as client generators need it.

* Every route names its ``operationId`` itself (camelCase: ``submitJobs``, ``getJob``,
  ``listJobs`` ...), so generated method names never change with a path or a function.
* ``Operation``: the operations this server accepts (its active profiles that a
  pipeline step implements, read when the document is first asked for), an enum that
  the submit body's ``operations`` and ``listJobs``'s ``operation`` refer to. Answers
  keep ``operation`` a plain string: a job may outlive its profile.
* ``ErrorCode``: every ``error.code`` this server answers (the
  :mod:`hypermedia.errors` tree, and the handler's own ``not_found``,
  ``method_not_allowed``, ``http_error``, ``internal``), an enum that ``ErrorBody``
  refers to. A job's ``error_code`` stays a string: pipeline steps add their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from hypermedia.errors import HypermediaError
from hypermedia.ingest.http_errors import HANDLER_CODES

OPERATION = "Operation"
ERROR_CODE = "ErrorCode"


def error_codes() -> list[str]:
    """Every code an API error may carry (the error classes imported so far: the API
    imports every module that defines one)."""
    found = set(HANDLER_CODES)
    pending: list[type[HypermediaError]] = [HypermediaError]
    while pending:
        cls = pending.pop()
        found.add(cls.code)
        pending.extend(cls.__subclasses__())
    return sorted(found)


def install(app: FastAPI, operations: Callable[[], list[str]]) -> None:
    """Make ``app.openapi`` build the document described in the module docstring."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                routes=app.routes,
            )
            _add_enums(schema, operations(), error_codes())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_enums(schema: dict[str, Any], operations: list[str], codes: list[str]) -> None:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components[OPERATION] = {
        "type": "string",
        "enum": operations,
        "description": "An operation this server accepts.",
    }
    components[ERROR_CODE] = {
        "type": "string",
        "enum": codes,
        "description": "A stable, machine-readable error code.",
    }
    ref = {"$ref": f"#/components/schemas/{OPERATION}"}
    submit = components.get("SubmitRequest", {}).get("properties", {})
    if "operations" in submit:
        submit["operations"]["items"] = dict(ref)
    body = components.get("ErrorBody", {}).get("properties", {})
    if "code" in body:
        description = body["code"].get("description", "")
        body["code"] = {"$ref": f"#/components/schemas/{ERROR_CODE}", "description": description}
    for path in schema.get("paths", {}).values():
        for method in path.values():
            if method.get("operationId") != "listJobs":
                continue
            for parameter in method.get("parameters", []):
                if parameter.get("name") == "operation":
                    parameter["schema"] = {"anyOf": [dict(ref), {"type": "null"}]}
