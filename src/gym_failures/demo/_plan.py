"""The fault plan: which faults the demo injects at each boundary, at what rate, and where they are logged.

A plan is a small JSON object. Every field is optional; a missing rate is 0 and a missing limit keeps
its default. Unknown keys are refused, so a misspelt fault is an error rather than a silent 0::

    {
      "model": {
        "server_error": 0.03,        a model call answered 500 (plain) or `response.failed` mid-stream
        "rate_limit": 0.03,          a model call answered 429, "... resets at YYYY-MM-DD HH:MM UTC"
        "dropped_connection": 0.02,  the model server closes the connection mid-reply
        "stream_cut": 0.02,          a streamed reply ends before its terminal event (streams only)
        "slow_response": 0.01,       the reply comes after `limits.slow_response_s`, past the
                                     agent's `limits.policy_timeout_s`
        "empty_answer": 0.02,        the policy answers with no text
        "truncated_answer": 0.02     the policy's answer stops at its output-token limit
      },
      "sandbox": {
        "oom": 0.03,                 the tool command first allocates past RLIMIT_AS
        "timeout": 0.02              the tool command first outlives the wall-time limit
      },
      "resources_server": {
        "verifier_exception": 0.02,  the verifier raises
        "judge_unparseable": 0.03    the judge model's reply holds no verdict
      },
      "proxy": {
        "unavailable": 0.06,         the chaos proxy in front of the resources server answers a
                                     `/verify` 503 with a short Retry-After: the agent retries it
        "outage": 0.015              ... with a Retry-After past the agent's budget for the call:
                                     the attempt fails (`gym_failures.demo.proxy_server`)
      },
      "limits": {
        "policy_timeout_s": 2.0,     the agent's deadline for one policy call
        "slow_response_s": 6.0,      how long a slow policy takes (must exceed the deadline)
        "sandbox_memory_mib": 256,   RLIMIT_AS of every tool command
        "sandbox_wall_s": 3.0        wall time of every tool command before its group is killed
      }
    }

Each place a fault can happen (a site) draws one number per operation and maps it onto that site's
faults in the order above, so the rates of one site must sum to at most 1 and one operation gets at
most one fault. The sites: a model call, keyed by the call and its try so that a retried call draws
again and transient faults usually recover (a policy call can get every `model` fault, a judge call
only the first three, which are the model server's, not the policy's); a judge reply
(`judge_unparseable`, drawn only for a reply no other fault breaks); a verification
(`verifier_exception`); a tool run (every `sandbox` fault); a try of the agent's `/verify` call
at the chaos proxy (every `proxy` fault). The draw is a hash of the run's seed,
the site and the operation's identity (rollout id, episode attempt, call, try): the same seed and
plan inject the same faults into the same rollouts, whatever the timing.

Every server that injects a fault appends a line to `<run_dir>/<server>.injected.jsonl`
(`FaultRecorder`), the proxy included: the ground truth a reader compares the saved rows with.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import logging
import os
import time
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "DEFAULT_FAULT_PLAN",
    "FaultPlan",
    "FaultRecorder",
    "Limits",
    "ModelFaults",
    "ProxyFaults",
    "ResourcesServerFaults",
    "SandboxFaults",
    "draw",
    "load_fault_plan",
]

DEFAULT_FAULT_PLAN = "default_fault_plan.json"
"""The plan shipped in this package, read with `importlib.resources`."""

LOGGER = logging.getLogger("gym_failures.demo")

Rate = Annotated[float, Field(ge=0.0, le=1.0)]


class _Site(BaseModel):
    """The faults of one site: rates that sum to at most 1, drawn in field order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _rates_fit(self) -> Self:
        total = sum(getattr(self, name) for name in type(self).model_fields)
        if total > 1.0 + 1e-9:
            raise ValueError(f"the rates of one site sum to {total:g}, more than 1")
        return self

    def pick(self, u: float, allowed: frozenset[str] | None = None) -> str | None:
        """The fault whose band holds `u` (in [0, 1)); `None` for no fault, or for a fault not in
        `allowed` (a stream cut drawn for a plain reply): a band never moves to another fault."""
        edge = 0.0
        for name in type(self).model_fields:
            edge += getattr(self, name)
            if u < edge:
                return name if allowed is None or name in allowed else None
        return None


class ModelFaults(_Site):
    """Faults of a model call, injected by the model server (see the module docstring)."""

    server_error: Rate = 0.0
    rate_limit: Rate = 0.0
    dropped_connection: Rate = 0.0
    stream_cut: Rate = 0.0
    slow_response: Rate = 0.0
    empty_answer: Rate = 0.0
    truncated_answer: Rate = 0.0


class SandboxFaults(_Site):
    """Faults of a tool run, injected by the sandbox as real over-limit commands."""

    oom: Rate = 0.0
    timeout: Rate = 0.0


class ResourcesServerFaults(BaseModel):
    """Faults of verification. They live at different sites (the verifier, the judge model), so each
    is drawn on its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    verifier_exception: Rate = 0.0
    judge_unparseable: Rate = 0.0


class ProxyFaults(_Site):
    """Faults of a try of the agent's `/verify` call, injected by the chaos proxy in front of the
    resources server (`gym_failures.demo.proxy_server`): its `status` fault, answered 503 with a
    failure report of the resources server's boundary that names the proxy."""

    unavailable: Rate = 0.0
    outage: Rate = 0.0


class Limits(BaseModel):
    """The deadlines and limits the injected faults run into."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy_timeout_s: float = Field(default=2.0, gt=0)
    slow_response_s: float = Field(default=6.0, gt=0)
    sandbox_memory_mib: int = Field(default=256, ge=64)
    sandbox_wall_s: float = Field(default=3.0, gt=0)

    @model_validator(mode="after")
    def _slow_is_past_the_deadline(self) -> Self:
        # A "slow" reply that beats the deadline would be a normal reply logged as a fault.
        if self.slow_response_s <= self.policy_timeout_s:
            raise ValueError("slow_response_s must exceed policy_timeout_s")
        return self


class FaultPlan(BaseModel):
    """Per-boundary fault rates and the limits they meet; see the module docstring for the schema."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelFaults = Field(default_factory=ModelFaults)
    sandbox: SandboxFaults = Field(default_factory=SandboxFaults)
    resources_server: ResourcesServerFaults = Field(default_factory=ResourcesServerFaults)
    proxy: ProxyFaults = Field(default_factory=ProxyFaults)
    limits: Limits = Field(default_factory=Limits)

    def with_policy_timeout(self, policy_timeout_s: float) -> FaultPlan:
        """This plan with the agent's deadline for a policy call replaced; a planned slow reply stays
        slower than the new deadline, as `Limits` requires."""
        limits = self.limits.model_copy(
            update={
                "policy_timeout_s": policy_timeout_s,
                "slow_response_s": max(self.limits.slow_response_s, policy_timeout_s * 1.5),
            }
        )
        return self.model_copy(update={"limits": Limits.model_validate(limits.model_dump())})

    def fault_names(self) -> list[str]:
        """`<section>.<fault>` for every fault this plan injects at a rate above 0."""
        names: list[str] = []
        for section in ("model", "sandbox", "resources_server", "proxy"):
            faults = getattr(self, section)
            names.extend(
                f"{section}.{name}" for name in type(faults).model_fields if getattr(faults, name) > 0
            )
        return names


def load_fault_plan(path: Path | None = None) -> FaultPlan:
    """The plan in `path`, or the default plan shipped with the package."""
    if path is None:
        text = importlib.resources.files(__package__).joinpath(DEFAULT_FAULT_PLAN).read_text("utf-8")
    else:
        text = Path(path).read_text("utf-8")
    return FaultPlan.model_validate_json(text)


def draw(seed: int, *key: str | int) -> float:
    """A number in [0, 1) fixed by `seed` and `key`: the same operation draws the same number in
    every run and every process (unlike `hash`, which Python salts per process)."""
    data = json.dumps([seed, *key], separators=(",", ":")).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") / 2.0**64


class FaultRecorder:
    """Append one JSON line per injected fault to `<run_dir>/<server>.injected.jsonl`.

    One `write` per line on an `O_APPEND` descriptor: a server killed mid-run leaves at most one torn
    line, and the launcher's merge skips it.
    """

    def __init__(self, run_dir: Path, server: str) -> None:
        self.path = run_dir / f"{server}.injected.jsonl"
        self.server = server
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, fault: str, rollout_id: str, attempt: int, **facts: Any) -> None:
        row = {
            "fault": fault,
            "server": self.server,
            "rollout_id": rollout_id,
            "attempt": attempt,
            "time": round(time.time(), 3),
            **facts,
        }
        os.write(self._fd, (json.dumps(row, separators=(",", ":")) + "\n").encode())
        LOGGER.info("injected %s into rollout %s attempt %d", fault, rollout_id, attempt)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
