"""The demo's model server: the fault-injecting model endpoint with a scripted policy and judge.

It is `gym_failures.model_endpoint.ModelEndpoint` (so it serves `/v1/responses`, `/v1/chat/completions`
and `/v1/messages`, and injects faults the same way as `gym-failures serve model`) with the demo's
scripted answers (`respond`), its seeded per-try fault draws (`choose_fault`), its fault log
(`on_fault`) and its run-token guard. The demo's agent calls `/v1/responses`.

Run by the launcher as `python -m gym_failures.demo.model_server --config ... --fd ... --parent-pid ...`.

Two roles, chosen by the `X-Demo-Role` header:

- `policy` (the default): a deterministic scripted policy for arithmetic tasks ("What is 17 * 23?").
  Seeded by the run's seed, the rollout id and the attempt, it either answers at once (mostly right,
  sometimes off, as a sampled policy is) or first asks for the `run_shell` tool with a command such
  as `python3 -c "print(17 * 23)"`, then answers with what the sandbox printed. Every answer ends in
  `Final answer: <number>`.
- `judge`: a non-policy model that compares a reference and a candidate answer and replies
  `VERDICT: CORRECT` or `VERDICT: INCORRECT`.

The policy serves plain JSON and, with `"stream": true`, the Responses API's server-sent events
(`response.created`, `response.output_text.delta`, ..., and a terminal `response.completed`,
`response.incomplete` or `response.failed` carrying the failure report under
`FailureHeader.STREAM_FIELD`); the judge answers plain JSON.

Every request must carry the run's token (`gym_failures.demo._serve.DemoGuard`).

Faults (see `gym_failures.demo._plan`) are injected only into requests that carry the demo's identity
headers, and each one is recorded in `<run_dir>/model.injected.jsonl`. Failures this server produces
carry the stage of the caller's role: `agent` for the policy, `verification` for the judge. The
demo's plan names map onto the endpoint's faults (`_ENDPOINT_FAULT`); a rate-limited try sends
`Retry-After: 0`, because the demo's quota is a draw per try, which the next try draws again.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from gym_failures.demo._plan import FaultRecorder, draw
from gym_failures.demo._responses import function_call_item, message_item, message_text, new_id
from gym_failures.demo._serve import (
    ATTEMPT_HEADER,
    CALL_HEADER,
    ROLE_HEADER,
    ROLLOUT_HEADER,
    TRY_HEADER,
    DemoConfig,
    DemoGuard,
    main,
)
from gym_failures.failure_kinds import FailureStage
from gym_failures.failures import ModelFailure
from gym_failures.model_endpoint import (
    Fault,
    ModelCall,
    ModelEndpoint,
    ModelEndpointPlan,
    ToolCall,
    Turn,
    quota_reset,
)

__all__ = ["create_app", "scripted_judge", "scripted_policy"]

_TASK = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_REFERENCE = re.compile(r"reference answer:\s*(\S+)", re.IGNORECASE)
_CANDIDATE = re.compile(r"candidate answer:\s*(\S+)", re.IGNORECASE)

_PLAIN_FAULTS = frozenset(
    {"server_error", "rate_limit", "dropped_connection", "slow_response", "empty_answer", "truncated_answer"}
)
"""The model faults of a plain reply: a stream cut needs a stream."""
_JUDGE_FAULTS = frozenset({"server_error", "rate_limit", "dropped_connection"})
"""The model faults of a judge call: the serving faults. The policy's own behaviours (slow, empty or
truncated answers) are not the judge's; its own fault is `resources_server.judge_unparseable`."""

_TOOL_RATE = 0.5
"""How often the scripted policy first runs a command rather than answering at once."""
_SLIP_RATE = 0.15
"""How often its mental arithmetic is wrong: a sampled policy is not always right."""


# --- The scripted policy and judge ---------------------------------------------------------------


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def scripted_policy(
    items: Sequence[dict[str, Any]], *, seed: int, rollout_id: str, attempt: int, tools: bool
) -> list[dict[str, Any]]:
    """The policy's output items for a conversation: a `run_shell` call or a message with its answer."""
    prompt = next(
        (message_text(item) for item in items if item.get("role") == "user"),
        "",
    )
    task = _TASK.search(prompt)
    if task is None:
        return [message_item("I cannot find an arithmetic task here.\nFinal answer: 0")]
    a, op, b = int(task.group(1)), task.group(2), int(task.group(3))
    outputs = [item for item in items if item.get("type") == "function_call_output"]
    if outputs:
        printed = _printed_number(outputs[-1].get("output"))
        if printed is not None:
            return [message_item(f"The sandbox printed {printed}.\nFinal answer: {printed}")]
        # The tool gave nothing usable; fall back to mental arithmetic below.
    elif tools and draw(seed, "policy.tool", rollout_id, attempt) < _TOOL_RATE:
        command = f'python3 -c "print({a} {op} {b})"'
        return [function_call_item("run_shell", json.dumps({"command": command}))]
    value = _apply(a, op, b)
    slip = draw(seed, "policy.slip", rollout_id, attempt)
    if slip < _SLIP_RATE:
        value += 1 + int(slip * 60)  # an off-by-some slip, deterministic per rollout
    return [message_item(f"We need {a} {op} {b}. Working it out gives {value}.\nFinal answer: {value}")]


def _printed_number(output: object) -> str | None:
    """The first number a tool run printed on stdout; the agent sends the run as JSON."""
    if not isinstance(output, str):
        return None
    try:
        run = json.loads(output)
        stdout = run.get("stdout", "") if isinstance(run, dict) else output
    except ValueError:
        stdout = output
    match = _NUMBER.search(stdout) if isinstance(stdout, str) else None
    return None if match is None else match.group()


def scripted_judge(prompt: str) -> str:
    """`VERDICT: CORRECT` when the prompt's candidate answer equals its reference answer."""
    reference, candidate = _REFERENCE.search(prompt), _CANDIDATE.search(prompt)
    if reference is None or candidate is None:
        return "VERDICT: INCORRECT"
    try:
        same = float(reference.group(1)) == float(candidate.group(1))
    except ValueError:
        same = reference.group(1).strip().lower() == candidate.group(1).strip().lower()
    return "VERDICT: CORRECT" if same else "VERDICT: INCORRECT"


# --- The server ----------------------------------------------------------------------------------

_ENDPOINT_FAULT = {
    "rate_limit": "quota_429",
    "server_error": "server_500",
    "dropped_connection": "drop_connection",
    "stream_cut": "cut_stream",
    "slow_response": "slow",
    "empty_answer": "empty",
    "truncated_answer": "truncated",
}
"""The endpoint's fault for each model fault of the demo's plan (a server error mid-stream is
`stream_failed`)."""
_DEMO_FAULT = {
    **{endpoint: demo for demo, endpoint in _ENDPOINT_FAULT.items()},
    "stream_failed": "server_error",
}


@dataclass(frozen=True)
class _Identity:
    """Who makes a call, from the demo's identity headers (empty or 0 without them)."""

    judge: bool
    rollout_id: str
    attempt: int
    call: str
    try_number: int

    @classmethod
    def of(cls, call: ModelCall) -> _Identity:
        headers = call.headers
        return cls(
            judge=headers.get(ROLE_HEADER, "policy") == "judge",
            rollout_id=headers.get(ROLLOUT_HEADER, ""),
            attempt=_int(headers.get(ATTEMPT_HEADER)),
            call=headers.get(CALL_HEADER, ""),
            try_number=_int(headers.get(TRY_HEADER)),
        )


class _DemoModel:
    """The demo's answers, fault draws and fault log, as the endpoint's hooks."""

    def __init__(self, config: DemoConfig, recorder: FaultRecorder) -> None:
        self.config = config
        self.plan = config.plan
        self.recorder = recorder

    def stage(self, call: ModelCall) -> FailureStage:
        return "verification" if _Identity.of(call).judge else "agent"

    def choose_fault(self, call: ModelCall) -> Fault | None:
        """The model fault this call gets; only a call with the demo's identity headers gets one."""
        who = _Identity.of(call)
        if not who.rollout_id:
            return None
        u = draw(self.config.seed, "model", who.rollout_id, who.attempt, who.call, who.try_number)
        allowed = _JUDGE_FAULTS if who.judge else None if call.stream else _PLAIN_FAULTS
        name = self.plan.model.pick(u, allowed)
        if name is None:
            return None
        endpoint = "stream_failed" if name == "server_error" and call.stream else _ENDPOINT_FAULT[name]
        return Fault(endpoint, retry_after_s=0.0, delay_s=self.plan.limits.slow_response_s)

    def on_fault(self, call: ModelCall, fault: Fault, failure: ModelFailure | None) -> None:
        who = _Identity.of(call)
        event = {} if failure is None else {"event_id": failure.event_id}
        facts = {"call": who.call, "try": who.try_number, "stream": call.stream}
        self.recorder.record(
            f"model.{_DEMO_FAULT[fault.name]}", who.rollout_id, who.attempt, **event, **facts
        )

    def respond(self, call: ModelCall, fault: Fault | None) -> Turn:
        """The judge's verdict or the policy's turn, before any answer fault."""
        who = _Identity.of(call)
        items = _input_items(call.body.get("input"))
        if not who.judge:
            output = scripted_policy(
                items,
                seed=self.config.seed,
                rollout_id=who.rollout_id or new_id("anonymous"),
                attempt=who.attempt,
                tools=call.tools,
            )
            return _turn(output)
        text = scripted_judge("\n".join(message.text for message in call.messages))
        # Only into a reply that is delivered: an unparseable verdict lost with its connection
        # would be a fault nobody saw.
        if (
            fault is None
            and who.rollout_id
            and draw(self.config.seed, "judge", who.rollout_id, who.attempt, who.call, who.try_number)
            < self.plan.resources_server.judge_unparseable
        ):
            facts = {"call": who.call, "try": who.try_number, "stream": call.stream}
            self.recorder.record("resources_server.judge_unparseable", who.rollout_id, who.attempt, **facts)
            text = "The candidate's reasoning looks plausible, though I would not swear to it."
        return Turn(text=text)


def _input_items(value: object) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _turn(output: Sequence[dict[str, Any]]) -> Turn:
    """The scripted policy's Responses items as the endpoint's turn."""
    text = "".join(message_text({"content": item["content"]}) for item in output if item["type"] == "message")
    tools = tuple(
        ToolCall(item["name"], item["arguments"], item["call_id"])
        for item in output
        if item["type"] == "function_call"
    )
    return Turn(text=text, tool_calls=tools)


def _int(value: object) -> int:
    """`value` as an int when it is one (or its decimal text), else 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,18}", value.strip()):
        return int(value)
    return 0


def create_app(config: DemoConfig, token: str) -> ASGIApp:
    """The model server's ASGI app; every request must carry the run's `token` (`DemoGuard`)."""
    recorder = FaultRecorder(config.run_dir, "model")
    demo = _DemoModel(config, recorder)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            recorder.close()

    endpoint = ModelEndpoint(
        plan=ModelEndpointPlan(),
        respond=demo.respond,
        choose_fault=demo.choose_fault,
        on_fault=demo.on_fault,
        stage=demo.stage,
        # The demo's rate limits name their quota's reset, as the reports it prints read it.
        quota_reason=lambda call, fault: (
            f"requests-per-minute quota of {call.model} exhausted; resets at {quota_reset()} UTC"
        ),
    )
    return endpoint.app(middleware=[Middleware(DemoGuard, token=token)], lifespan=lifespan)


if __name__ == "__main__":
    main("model", create_app)
