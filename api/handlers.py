"""A plain route's request handler: FastAPI's rules for its parameters, without FastAPI's per-request machinery.

FastAPI's handler serves every shape of route: forms, streams, response models, dependencies with ``yield``,
background tasks, cookies and headers as parameters. Each request pays for all of it: a dependency tree walked
recursively (the key dependency is a tree of its own), a throwaway ``Response`` for sub-dependencies to set
headers on, four parameter sources read per level (cookies parsed though no route takes one), the
``Content-Type`` parsed by ``email.message``, telemetry look-ups and span scopes.

Most of engram's routes are plain: path and query parameters, at most one JSON body taken as it is, key
dependencies that read only the request, and a ``Response`` returned. For those, :func:`plain_handler`
builds a handler that does the same steps in the same order, with FastAPI's own functions where they decide
what a client sees: the body read and parsed (a malformed one is the same ``json_invalid`` validation error,
any other read failure the same 400), the key dependencies awaited in their order (a refused key answers
before any parameter is checked), then the path, query and body parameters validated (the same values and the
same errors, raised together as one ``RequestValidationError``): the body by ``request_body_to_args``, the path
and query parameters read as ``request_params_to_args`` reads them, with what it works out from each field's
annotation at every request (whether it is a sequence, a parameter model, its request keys: ~5% of a get's
instructions) worked out once per route, and each validated by FastAPI's own function. Any other route keeps
FastAPI's handler.

Dependency overrides never applied to engram's routes (api.app adds them to the app as they are, and a
route's overrides come from its own router), and still do not. What the plain handler leaves out is FastAPI's
own ``fastapi.dependencies`` and ``fastapi.endpoint`` spans inside a traced request and the request data it
keeps for OpenTelemetry log processors (engram exports no OpenTelemetry logs); the request's server span and
its SQL spans are as before.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi._compat import ModelField, field_annotation_is_sequence
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import (
    _get_param_aliases,
    _get_param_model,
    _is_json_field,
    _validate_value_with_model_field,
    get_typed_return_annotation,
    request_body_to_args,
)
from fastapi.exceptions import RequestValidationError
from fastapi.params import Form, Param
from fastapi.routing import APIRoute
from pydantic_core import PydanticUndefined
from starlette.datastructures import ImmutableMultiDict
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]

_UNDEFINED: Any = PydanticUndefined  # no body was sent (FastAPI's own marker: a parameter's default applies)


@dataclass(frozen=True)
class _Param:
    """A path or query parameter as ``request_params_to_args`` reads it, with what it works out from the field's
    annotation at every request worked out once."""

    field: ModelField
    source: str  # where it is read: path, query (the first element of an error's ``loc``)
    keys: tuple[str, ...]  # the request keys it is read from, in preference order (the first present, else the first)
    many: bool  # read as a list from a query string (a sequence annotation, not a Json field)
    sequence: bool  # an empty list is no value (the default applies)


def _params(fields: list[ModelField]) -> list[_Param] | None:
    """The fields as :class:`_Param`, or None when one is a parameter model (read by FastAPI's own function)."""
    prepared = []
    for field in fields:
        info = field.field_info
        if _get_param_model(field) is not None or not isinstance(info, Param):
            return None
        sequence = field_annotation_is_sequence(info.annotation)
        keys = tuple(key for _, key in _get_param_aliases(field))
        prepared.append(_Param(field, info.in_.value, keys, sequence and not _is_json_field(field), sequence))
    return prepared


def _params_to_args(params: list[_Param], received: Any) -> tuple[dict[str, Any], list[Any]]:
    """``request_params_to_args`` of the prepared fields: the same values and the same errors."""
    values: dict[str, Any] = {}
    errors: list[Any] = []
    multi = isinstance(received, ImmutableMultiDict)
    for param in params:
        keys = param.keys
        key = next((k for k in keys if k in received), keys[0]) if len(keys) > 1 else keys[0]
        value = received.getlist(key) if param.many and multi else received.get(key, None)
        if value is None or (param.sequence and len(value) == 0):
            value = _UNDEFINED
        found, failed = _validate_value_with_model_field(
            field=param.field, value=value, values=values, loc=(param.source, key)
        )
        if failed:
            errors.extend(failed)
        else:
            values[param.field.name] = found
    return values, errors


@dataclass(frozen=True)
class _KeyDependency:
    name: str | None  # the endpoint's parameter it fills; None for a route's ``dependencies=[...]``
    call: Callable[..., Awaitable[Any]]
    request_param: str


def plain_handler(route: APIRoute) -> Handler | None:
    """The plain handler of ``route``, or None when the route is not plain (FastAPI's handler serves it)."""
    dependant = route.dependant
    keys = _key_dependencies(dependant)
    path_params, query_params = _params(dependant.path_params), _params(dependant.query_params)
    if keys is None or path_params is None or query_params is None or not _plain(route):
        return None
    endpoint = dependant.call
    assert endpoint is not None
    body_params = dependant.body_params
    embed = route._embed_body_fields  # noqa: SLF001 (FastAPI's own reading of the body fields)
    request_param = dependant.request_param_name

    async def handle(request: Request) -> Response:
        body = await _json_body(request) if body_params else _UNDEFINED
        values: dict[str, Any] = {}
        for key in keys:
            caller = await key.call(**{key.request_param: request})
            if key.name is not None:
                values[key.name] = caller
        errors: list[Any] = []
        if path_params:
            found, failed = _params_to_args(path_params, request.path_params)
            values.update(found)
            errors += failed
        if query_params:
            found, failed = _params_to_args(query_params, request.query_params)
            values.update(found)
            errors += failed
        if body_params:
            found, failed = await request_body_to_args(body_params, body, embed_body_fields=embed)
            values.update(found)
            errors += failed
        if errors:
            raise RequestValidationError(errors, body=None if body is _UNDEFINED else body)
        if request_param is not None:
            values[request_param] = request
        response = await endpoint(**values)
        if not isinstance(response, Response):
            raise TypeError(f"{route.path}: a plain route's endpoint must return a Response")
        return response

    return handle


def plain_app(handler: Handler) -> ASGIApp:
    """A plain route's ASGI app: the request made, the handler's response sent.

    FastAPI's wrapper (``request_response``) opens two exit stacks a request for dependencies with ``yield``
    (a plain route has none) and passes a raised exception through the app's exception handlers itself; here
    it goes on to the app's ``ExceptionMiddleware``, which answers it with the same handlers."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await handler(Request(scope, receive, send))
        await response(scope, receive, send)

    return app


def _plain(route: APIRoute) -> bool:
    """Whether the route takes only what the plain handler reads and returns a ``Response`` of its own."""
    dependant = route.dependant
    if not _is_coroutine(dependant.call):
        return False
    if route.response_model is not None or not _returns_response(dependant):
        return False
    if dependant.header_params or dependant.cookie_params or _special_params(dependant):
        return False
    strict = route.strict_content_type
    if not (strict.value if isinstance(strict, DefaultPlaceholder) else strict):
        return False
    if route.max_body_size is not None:  # FastAPI's own body limit, answered by its handler (engram's: api.app)
        return False
    return len(dependant.body_params) <= 1 and not any(isinstance(f.field_info, Form) for f in dependant.body_params)


def _key_dependencies(dependant: Dependant) -> list[_KeyDependency] | None:
    """The route's dependencies when each is a coroutine function of the request alone (the keys' checks),
    each called once; else None."""
    keys: list[_KeyDependency] = []
    for sub in dependant.dependencies:
        if (
            sub.call is None
            or not _is_coroutine(sub.call)
            or sub.request_param_name is None
            or sub.dependencies
            or sub.path_params
            or sub.query_params
            or sub.header_params
            or sub.cookie_params
            or sub.body_params
            or _special_params(sub)
            or any(key.call is sub.call for key in keys)
        ):
            return None
        keys.append(_KeyDependency(name=sub.name, call=sub.call, request_param=sub.request_param_name))
    return keys


def _special_params(dependant: Dependant) -> bool:
    return any(
        name is not None
        for name in (
            dependant.websocket_param_name,
            dependant.http_connection_param_name,
            dependant.response_param_name,
            dependant.background_tasks_param_name,
            dependant.security_scopes_param_name,
        )
    )


def _returns_response(dependant: Dependant) -> bool:
    assert dependant.call is not None
    annotation = get_typed_return_annotation(dependant.call)
    return isinstance(annotation, type) and issubclass(annotation, Response)


def _is_coroutine(call: Any) -> bool:
    return inspect.iscoroutinefunction(call)


async def _json_body(request: Request) -> Any:
    """The request's body as FastAPI reads a JSON body parameter: no bytes, none; a JSON media type, parsed;
    anything else, the bytes (api.app.BodyGuard answers 415 to a body of another media type first)."""
    try:
        raw = await request.body()
        if not raw:
            return _UNDEFINED
        if not _is_json(request.headers.get("content-type")):
            return raw
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {},
                 "ctx": {"error": exc.msg}}  # fmt: skip
        raise RequestValidationError([error], body=exc.doc) from exc
    except HTTPException:
        raise
    except Exception as exc:
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc


def _is_json(content_type: str | None) -> bool:
    """FastAPI's test (``email.message``'s reading of the media type): ``application/json`` or
    ``application/<anything>+json``, parameters and case aside; a value without exactly one ``/`` is
    ``text/plain``."""
    if not content_type:
        return False
    media = content_type.partition(";")[0].strip().lower()
    if media.count("/") != 1:
        return False
    main, _, sub = media.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))
