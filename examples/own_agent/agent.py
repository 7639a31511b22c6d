"""A gym-failures agent server: `gym-failures collect` POSTs each rollout to /run."""

import re
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failures import AgentFailure
from gym_failures.reply import episode_response

app = FastAPI()
app.add_middleware(FailureReportMiddleware, boundary="agent")  # a raised failure becomes its reply


class Run(BaseModel):
    task: dict[str, Any]  # one line of the task file, as written
    rollout_id: str  # "<task>:<rollout>"
    attempt: int  # 1 on the first attempt, 2 on its first retry...


async def policy(prompt: str) -> str:
    """Your model call goes here. This one adds the numbers in "What is 2 + 2?"."""
    return str(sum(int(number) for number in re.findall(r"-?\d+", prompt.split("(")[0])))


@app.post("/run")
async def run(request: Run) -> dict[str, Any]:
    params = request.task.get("responses_create_params") or {}
    prompt = params.get("input") if isinstance(params, dict) else None
    if not isinstance(prompt, str):
        # The task can never run: a terminal failure, not a reward of 0 (and not retried).
        failure = AgentFailure(
            failure_kind="environment_prepare_failed",
            failure_reason="the task has no responses_create_params.input",
            stage="admission",
        )
        return episode_response(failure=failure, terminal=True).model_dump(mode="json")
    answer = await policy(prompt)
    reward = 1.0 if answer == str(request.task.get("expected")) else 0.0
    return episode_response(result={"reward": reward, "response": answer}).model_dump(mode="json")
