"""A streaming agent built as the docs recommend (the official openai SDK wrapped in `observe_attempts`,
`agent_app`), careless or careful, for the tests that judge by what happened.

- `naive`: joins the stream's text into its answer, whatever the hook saw (a cut stream's half
  included): the careless agent every verdict must fail.
- `careful`: issues the stream again inside one `logical_call()` while the hook saw it fail, at most
  three times, and raises the last failure if none succeeded.

Its reward is 1.0 when the answer repeats the task's prompt (`serve model` echoes it), else 0.0.

Run with `python -m tests.evidence.sdk_agent PORT MODE MODEL_BASE_URL`.
"""

from __future__ import annotations

import sys
from typing import Any

import openai
import uvicorn

from gym_failures.agent import agent_app
from gym_failures.calls import logical_call
from gym_failures.client import observe_attempts, observed_failure
from gym_failures.failures import AgentFailure, NgFailureEvent

KEY = "sk-gym-test-key-0123456789"


def make_run(mode: str, base_url: str) -> Any:
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key=KEY,
        max_retries=2,
        http_client=observe_attempts(openai.DefaultAsyncHttpxClient()),
    )

    async def answer(prompt: str) -> tuple[str, NgFailureEvent | None]:
        stream = await client.responses.create(model="m", input=prompt, stream=True)
        text = "".join([event.delta async for event in stream if event.type == "response.output_text.delta"])
        return text, observed_failure(stream)

    async def run(task: dict[str, Any], rollout_id: str, attempt: int) -> dict[str, Any]:
        prompt = task["prompt"]
        if mode == "naive":
            text, _ = await answer(prompt)
        else:
            with logical_call():
                for _ in range(3):
                    text, failure = await answer(prompt)
                    if failure is None:
                        break
                else:
                    raise AgentFailure(
                        failure_kind="agent_run_error", failure_reason="no whole answer"
                    ) from failure
        return {"reward": 1.0 if prompt in text else 0.0, "response": text}

    return run


if __name__ == "__main__":
    port, mode, base_url = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    uvicorn.run(agent_app(make_run(mode, base_url)), host="127.0.0.1", port=port, log_level="warning")
