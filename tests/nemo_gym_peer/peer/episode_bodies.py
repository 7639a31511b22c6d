"""An environment server's episode body that the app builds and serializes itself, in NeMo Gym
0.7.0's venv: a FastAPI app with gym-failures' middleware (as `instrument` adds it), whose handlers
quote the request's bearer token in an `EpisodeFailure` and return the body, gym-failures' records
(`BaseEpisodeResponse(...).model_dump()`) or NeMo Gym's own (`nemo_gym.episode_types`). argv[1] is
the token. Reports each body as the client received it, and NeMo Gym's reading of ours."""

import asyncio
import sys

import httpx
from _peer import report
from fastapi import FastAPI, Request
from nemo_gym import episode_types

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure

TOKEN = sys.argv[1]
app = FastAPI()


def _quoted(request: Request) -> str:
    return f"the episode's sandbox refused {request.headers['authorization'].partition(' ')[2]}"


@app.post("/ours")
async def ours(request: Request) -> dict:
    failure = EpisodeFailure(failure_kind="session_lost", failure_reason=_quoted(request), terminal=True)
    return BaseEpisodeResponse(failure=failure).model_dump()


@app.post("/nemo-gym")
async def nemo_gym(request: Request) -> dict:
    failure = episode_types.EpisodeFailure(
        failure_kind="session_lost", failure_reason=_quoted(request), terminal=True
    )
    return episode_types.BaseEpisodeResponse(
        episode_id=episode_types.EpisodeId(rollout_id="0-0"),
        task_id=episode_types.TaskId(taskset="t", task_id="0"),
        failure=failure,
    ).model_dump()


app.add_middleware(FailureReportMiddleware, boundary="environment")


async def main() -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://env") as client:
        headers = {"authorization": f"Bearer {TOKEN}"}
        bodies = {
            path: (await client.post(f"/{path}", headers=headers, json={})).text
            for path in ("ours", "nemo-gym")
        }
    read = episode_types.EpisodeFailure.model_validate_json(
        BaseEpisodeResponse.model_validate_json(bodies["ours"]).failure.model_dump_json()
    )
    report({"bodies": bodies, "nemo_gym_reads_ours": read.model_dump(mode="json")})


asyncio.run(main())
