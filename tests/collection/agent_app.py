"""An agent server that fails in planned ways, chosen by each task's `mode`, for collection tests.

A task's `sleep` delays its reply by that many seconds; its `until` holds the reply until the file it
names exists (a gate the test opens: no test waits on a race against a sleep); its `arrived` names a
directory where each attempt leaves a file as it arrives (`Held`, tests/on_ray/saved.py). A `fail_as`
task fails every attempt with its `kind` at its `boundary` until the file its `fixed` names exists,
then succeeds.

Run with `python -m tests.collection.agent_app PORT [LISTEN_AFTER_S]`.
"""

from __future__ import annotations

import asyncio
import base64
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, FailureReport
from gym_failures.failure_transport import (
    observe_failure,
    reply_failure_report,
    report_for_current_request,
)
from gym_failures.failures import AgentFailure, ModelFailure, NgFailureEvent, SandboxFailure

_FAILURES: dict[str, type[NgFailureEvent]] = {
    "agent": AgentFailure,
    "model": ModelFailure,
    "sandbox": SandboxFailure,
}
"""The boundaries a `fail_as` task may name, by their failure classes."""


async def run(request: Request) -> Response:
    body = await request.json()
    task: dict[str, Any] = body["task"]
    attempt: int = body["attempt"]
    mode = task["mode"]
    if "arrived" in task:
        # A register of the attempts that reached the agent: a file named for the rollout and attempt,
        # made as the request arrives, in the directory the task names. A test counts them to know
        # that the attempts a gate holds are running (each worker runs at most its concurrency).
        Path(task["arrived"], f"{body['rollout_id']}.{attempt}").touch()
    await asyncio.sleep(float(task.get("sleep", 0)))
    if "until" in task:
        # A gate: the reply waits until the test creates the file the task names, so "still running
        # when the test looks" holds by construction, however slow the machine.
        while not Path(task["until"]).exists():
            await asyncio.sleep(0.01)
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
    if mode == "fail_as":
        # A dependency down behind the agent (issue 30's breaker): every attempt answered at once with
        # the failure of the kind and boundary the task names, until the file its `fixed` names exists.
        if "fixed" in task and Path(task["fixed"]).exists():
            return JSONResponse(BaseEpisodeResponse(result={"reward": 1.0}).model_dump(mode="json"))
        boundary = _FAILURES[task.get("boundary", "model")]
        try:
            raise boundary(failure_kind=task["kind"], failure_reason="down", stage="agent")
        except boundary as down:
            episode = BaseEpisodeResponse(
                failure=EpisodeFailure(
                    failure_kind=task["kind"], failure_reason="down", stage="agent", terminal=False
                ),
                failure_report=reply_failure_report(down),
            )
            return JSONResponse(episode.model_dump(mode="json"))
    if mode == "fail_rollouts":
        # Some members of a prompt group fail their first attempt (issue 30's short groups): the
        # rollouts whose index the task's `fail` lists, at attempt 1; every other attempt succeeds.
        rollout = int(str(body["rollout_id"]).rpartition(":")[2])
        if attempt == 1 and rollout in task["fail"]:
            failed = EpisodeFailure(failure_kind="agent_run_error", failure_reason="failed", terminal=False)
            return JSONResponse(BaseEpisodeResponse(failure=failed).model_dump(mode="json"))
        return JSONResponse(BaseEpisodeResponse(result={"reward": 1.0}).model_dump(mode="json"))
    if mode == "raise":
        raise ModelFailure(failure_kind="model_server_error", failure_reason="upstream 503", http_status=503)
    if mode == "garbage":
        return JSONResponse({"reward": 0.0})
    if mode == "result":
        # The result the task names, as it is: one without a reward, one with metrics of its own.
        return JSONResponse({"result": task["result"]})
    if mode == "echo":
        # The task as the agent received it, for tests of what the collector sends.
        return JSONResponse(BaseEpisodeResponse(result={"reward": 1.0, "task": task}).model_dump(mode="json"))
    if mode in ("big_report", "dropped_report"):
        # Retried model calls, each observed: 20 make a report over the header's 4096 bytes (sent
        # whole in the body); 70 also pass the log's 64 events, so the report itself lost events.
        count = 20 if mode == "big_report" else 70
        for index in range(count):
            observe_failure(
                ModelFailure(
                    failure_kind="model_server_error",
                    failure_reason=f"retry {index}: " + "x" * 150,
                    http_status=500,
                )
            )
        reply = BaseEpisodeResponse(result={"reward": 1.0}, failure_report=report_for_current_request(None))
        return JSONResponse(reply.model_dump(mode="json"))
    if mode == "error_body":
        # An HTTP error without a report, its body quoting what the task asks it to (canary secrets).
        return Response(str(task.get("body", "")).encode(), status_code=502, media_type="text/plain")
    if mode == "masked":
        masked: dict[str, Any] = {
            "reward": 0.0,
            "response": {"output": []},
            "mask_sample": True,
            "failure_reason": "no verdict",
        }
        return JSONResponse(BaseEpisodeResponse(result=masked).model_dump(mode="json"))
    if mode == "huge_body_report":
        # A report built by hand, past the per-request log's 64 events: nothing bounded it on the way.
        events = [
            ModelFailure(failure_kind="model_server_error", failure_reason=f"retry {i}") for i in range(100)
        ]
        report = FailureReport()
        for observed in events:
            report = report.merged(observed.failure_report().model_copy(update={"failure_id": None}))
        return JSONResponse(
            BaseEpisodeResponse(result={"reward": 1.0}, failure_report=report).model_dump(mode="json")
        )
    if mode == "quote_credentials":
        # A careless agent: its hand-built body quotes the request's Authorization header (the Basic
        # credential the collector's client made of the agent URL's user info), decoded too.
        authorization = request.headers.get("authorization", "")
        decoded = base64.b64decode(authorization.partition(" ")[2] or b"").decode()
        quoted = f"refused {authorization} ({decoded})"
        if attempt == 1:
            refused = EpisodeFailure(failure_kind="agent_run_error", failure_reason=quoted, terminal=False)
            return JSONResponse(BaseEpisodeResponse(failure=refused).model_dump(mode="json"))
        return JSONResponse(
            BaseEpisodeResponse(result={"reward": 1.0, "note": quoted}).model_dump(mode="json")
        )
    if mode == "shed_then_ok":
        # Load shed: the first attempt is refused with a 429 or 503 and the wait the task names, as
        # `Retry-After` (`retry_after`, seconds or an HTTP date) or `retry-after-ms`.
        if attempt >= 2:
            return JSONResponse(BaseEpisodeResponse(result={"reward": 1.0}).model_dump(mode="json"))
        headers = {}
        if "retry_after" in task:
            headers["Retry-After"] = str(task["retry_after"])
        if "retry_after_ms" in task:
            headers["retry-after-ms"] = str(task["retry_after_ms"])
        return Response(b"busy", status_code=int(task.get("status", 429)), headers=headers)
    if mode == "quota_then_ok":
        # The agent's model ran out of quota: an episode failure naming when the quota resets.
        if attempt >= 2:
            return JSONResponse(BaseEpisodeResponse(result={"reward": 1.0}).model_dump(mode="json"))
        quota = EpisodeFailure(
            failure_kind="provider_quota_exhausted",
            failure_reason=f"daily quota used; resets at {task['resets_at']}",
            terminal=False,
        )
        return JSONResponse(BaseEpisodeResponse(failure=quota).model_dump(mode="json"))
    if mode == "no_reward":  # a success with nothing to score: no reward, no verification
        return JSONResponse(BaseEpisodeResponse(result={"response": "4"}).model_dump(mode="json"))
    if mode == "nan_reward":
        return Response(b'{"result": {"reward": NaN}}', media_type="application/json")
    raise ValueError(f"unknown mode {mode!r}")


def app() -> Starlette:
    application = Starlette(routes=[Route("/run", run, methods=["POST"])])
    application.add_middleware(FailureReportMiddleware, boundary="agent")
    return application


if __name__ == "__main__":
    # `PORT [LISTEN_AFTER_S]`: an agent still starting listens only after that many seconds.
    if len(sys.argv) > 2:
        time.sleep(float(sys.argv[2]))
    uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
