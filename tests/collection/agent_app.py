"""An agent server that fails in planned ways, chosen by each task's `mode`, for collection tests.

Run with `python -m tests.collection.agent_app PORT`.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure
from gym_failures.failure_transport import observe_failure, reply_failure_report
from gym_failures.failures import AgentFailure, ModelFailure, SandboxFailure


async def run(request: Request) -> Response:
    body = await request.json()
    task: dict[str, Any] = body["task"]
    attempt: int = body["attempt"]
    mode = task["mode"]
    await asyncio.sleep(float(task.get("sleep", 0)))
    if mode == "ok" or (mode == "retry_then_ok" and attempt >= 2):
        # A recovered model attempt: the success row keeps it as an observation.
        observe_failure(ModelFailure(failure_kind="model_server_error", failure_reason="attempt 1 got 503"))
        return JSONResponse(BaseEpisodeResponse(result={"reward": 1.0}).model_dump(mode="json"))
    if mode in ("terminal", "retry_then_ok", "always_fail"):
        try:
            raise SandboxFailure(failure_kind="provider_oom_killed", failure_reason="exit 137", stage="agent")
        except SandboxFailure as oom:
            try:
                raise AgentFailure(
                    failure_kind="agent_run_error", failure_reason="tool run failed", stage="agent"
                ) from oom
            except AgentFailure as failure:
                episode = BaseEpisodeResponse(
                    failure=EpisodeFailure(
                        failure_kind="agent_run_error",
                        failure_reason="tool run failed",
                        stage="agent",
                        terminal=mode == "terminal",
                    ),
                    failure_report=reply_failure_report(failure),
                )
                return JSONResponse(episode.model_dump(mode="json"))
    if mode == "raise":
        raise ModelFailure(failure_kind="model_server_error", failure_reason="upstream 503", http_status=503)
    if mode == "garbage":
        return JSONResponse({"reward": 0.0})
    raise ValueError(f"unknown mode {mode!r}")


def app() -> Starlette:
    application = Starlette(routes=[Route("/run", run, methods=["POST"])])
    application.add_middleware(FailureReportMiddleware, boundary="agent")
    return application


if __name__ == "__main__":
    uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
