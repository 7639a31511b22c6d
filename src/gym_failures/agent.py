"""Your own agent server: the `POST /run` route `gym-failures collect` calls, made from one coroutine.

`run_route(run)` is a Starlette route (FastAPI takes it too: `app.router.routes.append(...)`) and
`agent_app(run)` a whole Starlette app with `FailureReportMiddleware` around it, for
`async def run(task, rollout_id, attempt)`, which gets the request's three fields (docs/agents.md)
and returns the episode:

- a mapping: the `result` (its `reward`, a finite number, is the measurement; `response`,
  `verification`, `mask_sample`... as docs/agents.md says);
- a number (not a bool): the result `{"reward": number}`;
- a `BaseEpisodeResponse` (`episode_response(failure=..., terminal=True)`, say): sent as it is.

A Gym failure it raises (`AgentFailure`, a `ModelFailure` that `raise_boundary_failure` rebuilt) is the
episode's failure, replied in a 200 with its report, and retried by the collector (return
`episode_response(failure=..., terminal=True)` for a failure a retry cannot help). Any other exception
is the agent's own fault: it propagates, and the middleware replies 500 with the failure report.

A request that is not the protocol's (not JSON, not an object with a `task` object, a string
`rollout_id` and an integer `attempt` of at least 1) is answered 400 with an error body and report
naming `environment_protocol_violation`: the caller is not `gym-failures collect` speaking this
version of the protocol. Nothing from the request is quoted in the reply but the fields' names.

Needs the starlette extra (or fastapi).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures.asgi import FailureReportMiddleware, error_body
from gym_failures.failure_kinds import ENVIRONMENT_PROTOCOL_VIOLATION
from gym_failures.failure_records import BaseEpisodeResponse
from gym_failures.failures import AgentFailure, NgFailureEvent
from gym_failures.reply import episode_response, reply_headers

__all__ = ["RunEpisode", "agent_app", "run_route"]

RunEpisode = Callable[[dict[str, Any], str, int], Awaitable[Any]]
"""`async def run(task, rollout_id, attempt)`: a result mapping, a reward, or a `BaseEpisodeResponse`."""


def _refused(reason: str) -> Response:
    failure = AgentFailure(
        failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION, failure_reason=reason, stage="admission"
    )
    return Response(
        error_body(failure.to_event(), status=400),
        status_code=400,
        media_type="application/json",
        headers=reply_headers(failure),
    )


def _episode(returned: object) -> BaseEpisodeResponse:
    if isinstance(returned, BaseEpisodeResponse):
        return returned
    if isinstance(returned, Mapping):
        return episode_response(result=dict(returned))
    if isinstance(returned, int | float) and not isinstance(returned, bool):
        if isinstance(returned, float) and not math.isfinite(returned):
            raise ValueError("run returned a reward that is not a finite number")
        return episode_response(result={"reward": returned})
    raise TypeError(
        f"run returned {type(returned).__name__}: return a result mapping, a reward or a BaseEpisodeResponse"
    )


def run_route(run: RunEpisode, *, path: str = "/run") -> Route:
    """The `POST path` route that calls `run(task, rollout_id, attempt)` and replies its episode."""

    async def endpoint(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _refused("the request body is not JSON")
        if not isinstance(body, dict):
            return _refused("the request body is not a JSON object")
        task, rollout_id, attempt = body.get("task"), body.get("rollout_id"), body.get("attempt")
        if not isinstance(task, dict):
            return _refused("the request has no task object")
        if not isinstance(rollout_id, str):
            return _refused("the request has no rollout_id string")
        if type(attempt) is not int or attempt < 1:
            return _refused("the request has no attempt number (an integer from 1)")
        try:
            returned = await run(task, rollout_id, attempt)
        except NgFailureEvent as failure:
            return JSONResponse(episode_response(failure=failure).model_dump(mode="json"))
        return JSONResponse(_episode(returned).model_dump(mode="json"))

    return Route(path, endpoint, methods=["POST"])


def agent_app(run: RunEpisode, *, path: str = "/run") -> Starlette:
    """A Starlette app serving `run_route(run)`, with `FailureReportMiddleware` (boundary `agent`)."""
    app = Starlette(routes=[run_route(run, path=path)])
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    return app
