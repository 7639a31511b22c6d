"""NeMo Gym's own model client samples 5 prompts 20 times each from `gym-failures serve model`.

    repeated_sampling.py BASE_URL API_KEY

`NeMoGymAsyncOpenAI` (nemo_gym/openai_utils.py) is the aiohttp client NeMo Gym's model servers call
their upstream with: it retries a 429 or a 5xx itself (`_request_with_retry`, 0.5 s apart) and sends no
call identity of its own. RL collection sends identical bodies on purpose (`num_repeats`): 100
rollouts of 5 prompts are 100 calls, whatever the bodies say. Eight calls run at once, as a collector
with a concurrency limit runs them. Reports how many calls succeeded.
"""

import asyncio
import sys

from _peer import report
from nemo_gym.openai_utils import NeMoGymAsyncOpenAI
from nemo_gym.server_utils import GlobalAIOHTTPAsyncClientConfig, set_global_aiohttp_client

PROMPTS = 5
REPEATS = 20


async def main(base_url: str, api_key: str) -> dict[str, int]:
    # The pool a NeMo Gym server sets up from its config; its defaults, here without a config file.
    set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    client = NeMoGymAsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_http_attempts=3)
    limit = asyncio.Semaphore(8)

    async def sample(prompt: int) -> bool:
        async with limit:
            reply = await client.create_response(model="gym-failures-echo", input=f"prompt {prompt}")
        return reply.get("status") == "completed"

    calls = [sample(prompt) for _ in range(REPEATS) for prompt in range(PROMPTS)]
    done = await asyncio.gather(*calls)
    return {"calls": len(done), "completed": sum(done)}


if __name__ == "__main__":
    report(asyncio.run(main(sys.argv[1], sys.argv[2])))
