"""An agent that asks an OpenAI-compatible model (`gym-failures serve model`, vLLM, a provider)."""

import os
from typing import Any

import aiohttp

from gym_failures.agent import agent_app
from gym_failures.client import map_transport_errors, raise_boundary_failure, retry_model_call

MODEL_URL = os.environ.get("MODEL_URL", "http://127.0.0.1:9000/v1").rstrip("/")
MODEL_NAME = os.environ.get("MODEL_NAME", "any")
API_KEY = os.environ.get("OPENAI_API_KEY")
HEADERS = {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}


async def ask(prompt: str) -> dict[str, Any]:
    """One Responses call, retried on a 429, a 5xx or a lost connection; a failure says which."""
    url = f"{MODEL_URL}/responses"
    body = {"model": MODEL_NAME, "input": prompt}

    async def call(attempt_id: str) -> dict[str, Any]:
        async with aiohttp.ClientSession(headers=HEADERS) as session:
            with map_transport_errors("model", method="POST", url=url):  # refused, reset, timeout
                async with session.post(url, json=body) as reply:
                    await raise_boundary_failure(reply, boundary="model")  # the model's failure, rebuilt
                    response: dict[str, Any] = await reply.json()
                    return response

    return await retry_model_call(call, replay_safe=True)


async def run(task: dict[str, Any], rollout_id: str, attempt: int) -> dict[str, Any]:
    response = await ask(task["responses_create_params"]["input"])
    text = "".join(
        part.get("text", "")
        for item in response.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
    )
    # The Responses object is saved as the response: the gate reads a cut or empty answer from it.
    return {"reward": 1.0 if str(task.get("expected")) in text else 0.0, "response": response}


app = agent_app(run)  # a model failure raised from run is the episode's failure, retried by collect
