"""OpenAI-style error bodies, and the handlers that make every failure one.

Body: {"error": {"message", "type", "param", "code"}}. Bad requests (validation, bad JSON,
values the engine rejects) are 400, an unknown model 404 (as OpenAI and vLLM), overload 429,
a stopped engine 503. Anything unexpected is a 500 with a one-line message, never a traceback.
"""
from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from tpsample.serve.async_engine import EngineStopped, Overloaded
from tpsample.serve.protocol import FIELD_NAMES

log = logging.getLogger("tpsample.serve")

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
          429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}


class ModelNotFound(Exception):
    pass


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, **kw) -> JSONResponse:
    return JSONResponse(error_body(status, message, **kw), status_code=status)


def _param_of(message: str) -> str | None:
    """The request field a ValueError's message is about: SamplingParams.<field>, or the field
    name it starts with."""
    m = re.search(r"SamplingParams\.(\w+)", message)
    if m:
        return m.group(1)
    m = re.match(r"[A-Za-z_][\w.]*", message)
    return m.group(0) if m and m.group(0).split(".")[0] in FIELD_NAMES else None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    ctx = e.get("ctx") or {}
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {ctx.get('error', e.get('msg'))}", None
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if "field" in ctx:                  # a model's own check, its message naming the field
        return str(e.get("msg")), ".".join(loc + [ctx["field"]])
    param = ".".join(loc) or None
    if e.get("type") == "extra_forbidden":
        return (f"{param} is not a field of this endpoint: unknown fields are refused, not ignored "
                "(docs/serving.md lists the fields)"), param
    return (f"{param}: {e.get('msg')}" if param else str(e.get("msg"))), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(ValueError)
    async def _value(request: Request, exc: ValueError):
        return error_response(400, str(exc), param=_param_of(str(exc)))

    @app.exception_handler(ModelNotFound)
    async def _model(request: Request, exc: ModelNotFound):
        return error_response(404, str(exc), param="model", code="model_not_found")

    @app.exception_handler(Overloaded)
    async def _overloaded(request: Request, exc: Overloaded):
        return error_response(429, str(exc), code="overloaded")

    @app.exception_handler(EngineStopped)
    async def _stopped(request: Request, exc: EngineStopped):
        return error_response(503, str(exc).splitlines()[0], code="engine_stopped")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error serving %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}")
