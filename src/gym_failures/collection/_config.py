"""What one collection run does: `CollectionConfig`, its defaults and the environment variables they read.

`backoff_initial_s` and `wait_ready_s` default from `GYM_FAILURES_BACKOFF_INITIAL_S` and
`GYM_FAILURES_WAIT_READY_S` (a value that is no finite number of seconds of at least 0 is warned about,
and the default used); `max_attempts` from NeMo Gym's `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`. An output path
that is a directory names the run's rows file in it (`CollectionConfig._run_directory`). A mistyped
agent URL can hold a password: no validation error echoes the input.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import yarl
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gym_failures import nemo_gym
from gym_failures.collection._breaker import BREAKER_ATTEMPTS
from gym_failures.collection._protocols import GYM_FAILURES_PROTOCOL, AgentProtocol
from gym_failures.collection._retry_rules import RetryRules
from gym_failures.materialized import MATERIALIZED_SUFFIX, materialized_path
from gym_failures.rows import FAILURES_SUFFIX, failures_path, manifest_path, run_rows_file

LOGGER = logging.getLogger("gym_failures.collection")

BACKOFF_INITIAL_ENV = "GYM_FAILURES_BACKOFF_INITIAL_S"
WAIT_READY_ENV = "GYM_FAILURES_WAIT_READY_S"
DEFAULT_BACKOFF_INITIAL_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_RETRY_AFTER_MAX_S = 300.0
DEFAULT_WAIT_READY_S = 60.0


def _env_seconds(name: str, default: float) -> float:
    """A default in seconds from the environment variable `name`, else `default` (warned when it is
    no finite number of at least 0)."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        LOGGER.warning("%s=%.40r is not a number of seconds; using %g", name, text, default)
        return default
    return value


class CollectionConfig(BaseModel):
    """What one collection run does."""

    # A mistyped agent URL can hold a password: never echo input in a validation error.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    input_path: Path
    output_path: Path
    """`<output>.jsonl`; failures go to `<output>_failures.jsonl` beside it. A directory names the one
    `<output>.jsonl` in it (a run directory, NeMo Gym's included), or `rollouts.jsonl` when it has none."""
    agent_url: str
    num_repeats: int = Field(default=1, ge=1)
    concurrency: int = Field(default=16, ge=1)
    max_attempts: int = Field(default_factory=nemo_gym.max_rollout_attempts, ge=1)
    """3, or NeMo Gym's `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` when set: the same budget NeMo Gym would use."""
    timeout_s: float = Field(default=120.0, gt=0)
    max_reply_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """The largest episode reply read; a larger one is the agent's protocol violation, not memory."""
    force_resume: bool = False
    replay_possibly_delivered: bool = True
    """Retry an attempt that may have reached the agent (timed out or reset after sending). An agent
    that cannot run an episode twice safely sets this to False: such an attempt is then final
    (`final_reason` `possibly_delivered`). An attempt never sent is always retried within the budget."""
    backoff_initial_s: float = Field(
        default_factory=lambda: _env_seconds(BACKOFF_INITIAL_ENV, DEFAULT_BACKOFF_INITIAL_S),
        ge=0,
        allow_inf_nan=False,
    )
    """The least wait before a rollout's next attempt (1 s, or `GYM_FAILURES_BACKOFF_INITIAL_S`); each
    later wait is drawn up to three times the one before (decorrelated jitter), never past
    `backoff_max_s`. 0 retries at once. A failure's own hint (`Retry-After`) takes its place."""
    backoff_max_s: float = Field(default=DEFAULT_BACKOFF_MAX_S, ge=0, allow_inf_nan=False)
    """The longest backoff wait (30 s); it caps `backoff_initial_s` too."""
    retry_after_max_s: float = Field(default=DEFAULT_RETRY_AFTER_MAX_S, ge=0, allow_inf_nan=False)
    """The longest wait a failure's hint is honoured for (300 s): its `Retry-After` (seconds, an HTTP
    date, or `retry-after-ms`) or a quota's reset time; a longer hint waits this long."""
    wait_ready_s: float = Field(
        default_factory=lambda: _env_seconds(WAIT_READY_ENV, DEFAULT_WAIT_READY_S),
        ge=0,
        allow_inf_nan=False,
    )
    """How long the agent may take to accept connections (60 s, or `GYM_FAILURES_WAIT_READY_S`), before
    the first attempt and whenever dispatch pauses after a run of transport failures; past it the run
    ends (`transport_unreachable`), the rollouts not yet final kept for the next run. 0: no readiness
    wait and no pause, every attempt is dispatched as it comes."""
    breaker_attempts: int = Field(default=BREAKER_ATTEMPTS, ge=0)
    """The breaker for fast failures (`gym_failures.collection._breaker`): when this many attempts in a
    row (10), across rollouts, failed with the same kind at the same boundary, dispatch holds to one
    probe at a time; a probe that does not fail so resumes it, and 3 that do end the run
    (`BreakerOpen`), the rollouts not yet final kept for the next run. 0 turns it off. Not on Ray: its
    driver dispatches in a loop of its own (`gym_failures.ray`)."""
    retry_terminal: bool = False
    """Reopen, on resume, the rollouts closed by a failure the agent marked `terminal` (within the
    budget); the rollouts closed by the budget are reopened whenever `max_attempts` is raised."""
    min_valid_per_group: int | None = Field(default=None, ge=1)
    """The valid members a prompt group (the rollouts of one task) needs, as the gate's
    `min_valid_per_group` counts them; None: all its members. The live view counts the groups
    complete, short and pending against it, and `fill_short_groups` fills to it
    (`gym_failures.collection._groups`). More than every group has is refused (`GroupsRefused`)."""
    fill_short_groups: bool = False
    """On resume, dispatch only the members the groups short of `min_valid_per_group` need, lowest
    rollout index first, leaving every other open rollout as it is for a later resume
    (`gym_failures.collection._groups`). Without a run to resume it is refused (`GroupsRefused`)."""
    retry_rules: RetryRules = Field(default_factory=RetryRules)
    """Retry rules (`gym_failures.collection._retry_rules`): the first that matches a failure gives its
    attempt budget, and may cap the retries it grants in the run. A failure none matches has
    `max_attempts`. None (the default): every failure has `max_attempts`, and no row says a rule."""
    agent_protocol: AgentProtocol = GYM_FAILURES_PROTOCOL
    """What `/run` the agent speaks: `gym-failures` (`gym_failures.collection._dispatcher`), or
    `nemo-gym`, NeMo Gym's own agents' `/run` (`gym_failures.collection._nemo_gym_protocol`: the
    materialized row in, the flat verify response out, stored as NeMo Gym stores it)."""

    @field_validator("output_path", mode="before")
    @classmethod
    def _new_directory(cls, value: object) -> object:
        # `"run/"` (a trailing slash, no such directory yet) is a run directory to make, its rows
        # `run/rollouts.jsonl`, as `collect --output run/` takes it; `Path` would drop the slash.
        if isinstance(value, str) and value.endswith(("/", os.sep)) and not Path(value).exists():
            return Path(value) / "rollouts.jsonl"
        return value

    @field_validator("output_path")
    @classmethod
    def _rows_file(cls, value: Path, info: ValidationInfo) -> Path:
        tasks = info.data.get("input_path")
        tasks = tasks.resolve() if isinstance(tasks, Path) else None
        rows = cls._run_directory(value, tasks)
        if rows.suffix != ".jsonl":
            raise ValueError(
                f"output_path {str(value)[:200]!r} is no directory and does not end in .jsonl: the "
                "readers find a run's rows and their failures by that name"
            )
        # The rows or their failures file being the task file would append rows to the tasks.
        if tasks is not None and tasks in (rows.resolve(), failures_path(rows).resolve()):
            which = "rows" if tasks == rows.resolve() else "failure rows"
            raise ValueError(f"output_path would write its {which} into the task file; name another")
        return rows

    @staticmethod
    def _run_directory(value: Path, tasks: Path | None) -> Path:
        # A run directory (NeMo Gym's, or ours) names its rows file: the one its only collection
        # manifest names, else the one `<name>.jsonl` in it that is neither a `_failures` sidecar
        # nor the task file; `rollouts.jsonl` in a directory without one.
        if not value.is_dir():
            return value
        named = run_rows_file(value)
        if named is not None:
            return named
        # NeMo Gym's run: the rows beside its one `<stem>_materialized_inputs.jsonl`.
        materialized = sorted(value.glob(f"*{MATERIALIZED_SUFFIX}.jsonl"))
        if len(materialized) == 1:
            return materialized[0].with_name(f"{materialized[0].stem[: -len(MATERIALIZED_SUFFIX)]}.jsonl")
        candidates = sorted(
            path
            for path in value.glob("*.jsonl")
            if path.is_file()
            and not path.stem.endswith(FAILURES_SUFFIX)
            and not nemo_gym.is_report_file(path)  # materialized inputs, health-check verdicts
            and path.resolve() != tasks
        )
        if len(candidates) > 1:
            names = ", ".join(path.name for path in candidates)
            raise ValueError(f"output_path is a directory with several row files ({names}); name one")
        return candidates[0] if candidates else value / "rollouts.jsonl"

    agent_name: str = Field(default="agent", min_length=1, max_length=128)
    """The agent's name, never its URL: every row's and materialized input's `agent_ref.name` (what
    NeMo Gym's aggregation groups a run's rows by) and telemetry's `nemo.gym.rollout.dispatch.name`.
    A resumed run whose materialized inputs name an agent keeps that name on its rows (its rows stay
    one group); a name set here that differs is warned about."""

    @field_validator("agent_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        # A URL no request can be sent to is a configuration error, refused before any row is
        # written rather than recorded as every rollout's failure.
        try:
            url = yarl.URL(value)
        except (TypeError, ValueError):
            raise ValueError("agent_url is not a URL") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("agent_url must be an http(s) URL with a host")
        return value

    @property
    def failures_path(self) -> Path:
        return failures_path(self.output_path)

    @property
    def manifest_path(self) -> Path:
        return manifest_path(self.output_path)

    @property
    def materialized_path(self) -> Path:
        """`<output>_materialized_inputs.jsonl`: the run's inventory in NeMo Gym's form."""
        return materialized_path(self.output_path)

    @property
    def lock_path(self) -> Path:
        return self.output_path.with_name(f"{self.output_path.stem}.lock")
