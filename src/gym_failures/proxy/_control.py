"""The proxy's control routes, under `/_gym/` (every other path is proxied):

    GET  /_gym/health              the proxy's own readiness (the upstream's `/health` is proxied)
    GET  /_gym/journal             every attempt journaled (`Attempt`), and how many were forgotten
    GET  /_gym/verdict             the recovery verdict on the journal (`?format=text`: its text);
    POST /_gym/verdict             the same with the client's event ids: {"client_event_ids": [...]}
    GET  /_gym/faults              the scenario queue
    POST /_gym/faults              queue a fault: {"fault": "status", "times": 2, "route": "/verify",
                                   "tool": null, "stream": null, "params": {"code": 503}}
    POST /_gym/reset               forget the journal, the queue and the header counts; the toxics
                                   become the plan's again
    GET  /_gym/proxy               the proxy in Toxiproxy's shape: name, listen, upstream, enabled,
                                   toxics
    GET  /_gym/toxics              the toxics in force (Toxiproxy's `GET /proxies/{proxy}/toxics`)
    POST /_gym/toxics              add one (Toxiproxy's body; 409 when its name is taken)
    GET  /_gym/toxics/{name}       one toxic (404 when there is none)
    POST /_gym/toxics/{name}       update it: its `toxicity`, `attributes` (merged), `stream`, `route`
    DELETE /_gym/toxics/{name}     remove it (204)

Errors come in Toxiproxy's shape, `{"error": "...", "status": N}`: 400 for a body that is not what
the route takes (or over `MAX_CONTROL_BODY`, refused as soon as it is), 401 without the key (when the
proxy has one), 404 (a toxic or a control route that is not there), 405, 409.
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gym_failures.model_endpoint._faults import misplaced_param
from gym_failures.model_endpoint._verdict import verdict_document
from gym_failures.proxy._toxics import Toxic

if TYPE_CHECKING:
    from gym_failures.proxy._app import ChaosProxy

__all__ = ["MAX_CONTROL_BODY", "control_app"]

MAX_CONTROL_BODY = 1 << 20


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def control_app(proxy: ChaosProxy) -> Any:
    """The ASGI app of the control routes of `proxy`."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    def guarded(handler: Any) -> Any:
        async def route(request: Any) -> Any:
            from starlette.responses import JSONResponse, Response

            try:
                _authorize(proxy, request.headers)
                result = await handler(proxy, request)
            except _Refused as refused:
                return JSONResponse({"error": refused.message, "status": refused.status}, refused.status)
            return result if isinstance(result, Response) else JSONResponse(result)

        return route

    routes = [
        Route("/_gym/health", guarded(_health), methods=["GET"]),
        Route("/_gym/journal", guarded(_journal), methods=["GET"]),
        Route("/_gym/verdict", guarded(_verdict), methods=["GET", "POST"]),
        Route("/_gym/faults", guarded(_faults), methods=["GET", "POST"]),
        Route("/_gym/reset", guarded(_reset), methods=["POST"]),
        Route("/_gym/proxy", guarded(_described), methods=["GET"]),
        Route("/_gym/toxics", guarded(_toxics), methods=["GET", "POST"]),
        Route("/_gym/toxics/{name}", guarded(_toxic), methods=["GET", "POST", "DELETE"]),
    ]

    async def not_found(request: Any, error: Exception) -> Any:
        from starlette.responses import JSONResponse

        status = getattr(error, "status_code", 404)
        return JSONResponse({"error": "no such control route", "status": status}, status)

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


async def _health(proxy: ChaosProxy, request: Any) -> Any:
    return {"status": "ok"}


async def _journal(proxy: ChaosProxy, request: Any) -> Any:
    attempts = [a.model_dump(mode="json") for a in proxy.journal.attempts()]
    return {"attempts": attempts, "dropped": proxy.journal.dropped}


async def _verdict(proxy: ChaosProxy, request: Any) -> Any:
    from starlette.responses import PlainTextResponse

    client = None
    if request.method == "POST":
        ids = (await _json_body(request)).get("client_event_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise _Refused(400, "`client_event_ids` must be a list of event ids")
        client = ids[:100_000]
    judged = proxy.verdict(client)
    if request.query_params.get("format") == "text":
        return PlainTextResponse(judged.text() + "\n")
    return verdict_document(judged, proxy.journal.attempts(), proxy.journal.dropped)


async def _faults(proxy: ChaosProxy, request: Any) -> Any:
    if request.method == "POST":
        _queue(proxy, await _json_body(request))
    return {"queued": proxy.forced.queued()}


async def _reset(proxy: ChaosProxy, request: Any) -> Any:
    proxy.reset()
    return {"reset": True}


async def _described(proxy: ChaosProxy, request: Any) -> Any:
    return {
        "name": "gym-failures",
        "listen": f"{request.url.hostname}:{request.url.port}",
        "upstream": proxy.forwarder.shown,
        "enabled": True,
        "toxics": [t.document() for t in proxy.toxics.listed()],
    }


async def _toxics(proxy: ChaosProxy, request: Any) -> Any:
    if request.method == "GET":
        return [t.document() for t in proxy.toxics.listed()]
    try:
        made = Toxic.model_validate(await _json_body(request))
    except ValidationError as error:
        raise _Refused(400, _problem(error)) from None
    try:
        proxy.toxics.add(made)
    except KeyError:
        raise _Refused(409, "toxic already exists") from None
    except ValueError as error:
        raise _Refused(400, str(error)) from None
    return made.document()


async def _toxic(proxy: ChaosProxy, request: Any) -> Any:
    from starlette.responses import Response

    name = request.path_params["name"]
    try:
        if request.method == "DELETE":
            proxy.toxics.remove(name)
            return Response(status_code=204)
        if request.method == "POST":
            return proxy.toxics.update(name, await _json_body(request)).document()
        return proxy.toxics.get(name).document()
    except KeyError:
        raise _Refused(404, "toxic not found") from None
    except ValidationError as error:
        raise _Refused(400, _problem(error)) from None
    except ValueError as error:  # a change of its name or type
        raise _Refused(400, str(error)) from None


def _authorize(proxy: ChaosProxy, headers: Any) -> None:
    if not proxy.api_key:
        return
    expected = proxy.api_key.encode()
    bearer = headers.get("authorization", "")
    offered = [bearer[7:] if bearer.lower().startswith("bearer ") else "", headers.get("x-api-key", "")]
    if not any(hmac.compare_digest(value.encode(), expected) for value in offered if value):
        raise _Refused(401, "the control routes need the proxy's key (Authorization: Bearer, or x-api-key)")


async def _json_body(request: Any) -> dict[str, Any]:
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # refused as soon as it is over the bound, not after it all
        size += len(chunk)
        if size > MAX_CONTROL_BODY:
            raise _Refused(400, "the body is over 1 MiB")
        parts.append(chunk)
    raw = b"".join(parts)
    try:
        parsed = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _Refused(400, "the body is not JSON") from None
    if not isinstance(parsed, dict):
        raise _Refused(400, "the body must be a JSON object")
    return parsed


def _queue(proxy: ChaosProxy, body: dict[str, Any]) -> None:
    fault, times, params = body.get("fault"), body.get("times", 1), body.get("params") or {}
    route, tool, stream = body.get("route"), body.get("tool"), body.get("stream")
    if not isinstance(fault, str) or not isinstance(params, dict):
        raise _Refused(400, "a scenario needs a `fault` name and `params` as an object")
    if times is not None and type(times) is not int:
        raise _Refused(400, "`times` must be a whole number or null")
    if not all(v is None or isinstance(v, str) for v in (route, tool)) or not (
        stream is None or isinstance(stream, bool)
    ):
        raise _Refused(400, "`route` and `tool` must be text, `stream` true or false")
    if misplaced := misplaced_param(params, ("fault", "times", "route", "tool", "stream")):
        raise _Refused(400, misplaced)
    try:
        proxy.force(fault, times=times, route=route, tool=tool, stream=stream, **params)
    except (TypeError, ValueError) as error:
        raise _Refused(400, str(error)) from None


def _problem(error: ValidationError) -> str:
    first = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    message = str(first.get("msg", "not valid")).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
