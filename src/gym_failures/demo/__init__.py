"""A small local gym with fault injection: four servers, a fault plan, and a launcher that collects.

    gym-failures demo                    # about 200 rollouts at concurrency 16
    gym-failures demo --rollouts 40 --fault-plan my_plan.json --seed 7
    python -m gym_failures.demo          # the same command, its same options and output

`run_demo` is the one entry point. Its options are the fields of `DemoOptions`, which holds their
defaults and validates them once (a refused one is a `DemoOptionsError`, a `ValueError` with a
one-line message); the command line (`gym-failures demo`, which `python -m gym_failures.demo` runs
too) only turns its flags into them. It starts four servers, each its
own process on a free loopback port:

- the model server (`gym_failures.demo.model_server`): an OpenAI Responses-compatible
  `POST /v1/responses`, plain and streamed, serving a deterministic scripted policy for arithmetic
  tasks (no GPU, no network) and a scripted judge;
- the resources server (`gym_failures.demo.resources_server`): `seed_session`, `verify` (answer
  extraction and a judge call) and a sandbox that runs the policy's commands as real subprocesses
  under real limits (RLIMIT_AS, a wall-time kill of the process group);
- the chaos proxy (`gym_failures.demo.proxy_server`): a `gym_failures.proxy.ChaosProxy` in front of
  the resources server, which answers some `/verify` calls 503 itself, so failures also come from a
  hop that is not the model (`--no-proxy` leaves it out);
- the agent server (`gym_failures.demo.agent_server`): `POST /run`, a short tool-use loop against the
  model server and, through the proxy, the resources server (its `seed_session` and `verify` calls
  retried on a 429 or 503 within a budget: `gym_failures.demo._resources_calls`).

The model, resources and agent servers are each wrapped in `FailureReportMiddleware`; the proxy
answers its own failures through it.

It then runs `gym_failures.collection.collect` against the agent and returns the run directory
(`out_dir/<UTC timestamp>/`; see `gym_failures.demo.launcher` for its files). The fault plan
(`gym_failures.demo._plan` documents the schema; the default is `default_fault_plan.json` in this
package) injects model 5xx and 429s, dropped connections, cut streams, a slow policy, sandbox OOMs and
timeouts, verifier exceptions, unparseable judge replies, empty or truncated answers and the proxy's
503s (one the agent's retry recovers from, and a rarer one whose Retry-After is past its budget), each
logged in `injected_faults.jsonl` beside the rows.

A real model instead of the scripted policy: any endpoint that serves the OpenAI Responses API
(`POST <base>/responses` with function tools)::

    export GYM_DEMO_MODEL_BASE_URL=https://api.openai.com/v1   # or http://localhost:8000/v1 (vLLM)
                                                               # (no user info or query: refused)
    export GYM_DEMO_MODEL_NAME=gpt-4.1-mini
    export GYM_DEMO_MODEL_API_KEY=...                          # else OPENAI_API_KEY; never a flag
    gym-failures demo                                          # or --model-base-url / --model-name

The agent then sends the policy's calls there (model faults are injected only by the scripted model
server, which still serves as the judge). The key is passed to the agent's environment only (the
other servers never see it) and never written to a file. The sandbox runs only
`python3 -c "print(<arithmetic>)"` commands, whoever asks: it bounds memory and time but is not an
isolation boundary, and a real model's commands run as your user.

Every endpoint of the demo's servers requires a random token the launcher makes for the run and
hands to the servers in their environment, and a JSON body: another local user, or a web page in
your browser, cannot drive them.

Needs the `demo` extra (`pip install 'gym-failures[demo]'`: uvicorn, starlette, aiohttp) and Linux
(RLIMIT_AS is what makes the sandbox's OOM real).
"""

from gym_failures.demo._plan import DEFAULT_FAULT_PLAN, FaultPlan, load_fault_plan

try:
    from gym_failures.demo._options import EXTERNAL_POLICY_TIMEOUT_S, DemoOptions, DemoOptionsError
    from gym_failures.demo.launcher import run_demo
except ImportError as error:  # pragma: no cover - depends on what is installed
    if error.name not in ("aiohttp", "starlette", "uvicorn"):
        raise
    raise ModuleNotFoundError(
        f"gym_failures.demo needs {error.name}: pip install 'gym-failures[demo]'", name=error.name
    ) from error

__all__ = [
    "DEFAULT_FAULT_PLAN",
    "EXTERNAL_POLICY_TIMEOUT_S",
    "DemoOptions",
    "DemoOptionsError",
    "FaultPlan",
    "load_fault_plan",
    "run_demo",
]
