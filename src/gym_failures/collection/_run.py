"""The collector: dispatch rollouts to an agent server, save each attempt's outcome and failure report.

Tasks: the input is JSONL, one task object a line. Blank lines and lines that are not a JSON object
are skipped and counted (`CollectionSummary.blank_task_lines`, `invalid_task_lines`). The input is
written once and never appended to, so an unterminated last line is an ordinary task. Tasks are
numbered as NeMo Gym numbers them (identical lines are one task; a row's own `_ng_task_index` is
kept), and every rollout of the run is written, before the first is dispatched, to the materialized
inputs `<output>_materialized_inputs.jsonl` in NeMo Gym's form (`gym_failures.materialized`): NeMo
Gym's `resume_from_cache` resumes the run only when they exist. When they exist they are the run's
inventory and numbering (a NeMo Gym run's, or ours): kept as they are, every rollout they list and no
other, `num_repeats` aside, unless a resume is forced against another input (`force_resume`), which
materializes the input again. A run saved before issue 19 (manifest version 2) keeps its own
numbering, its line numbers, and gets its materialized inputs on its first resume. A task is sent as
written, less the keys materialization adds (`agent_ref` and the indices).

Rows (`gym_failures.row_keys`): a row keeps no bookkeeping where NeMo Gym averages it (a numeric
top-level key without a leading `_`): the indices and the attempt are NeMo Gym's `_ng_task_index`,
`_ng_rollout_index`, `_ng_attempt_index`; `final`, `final_reason`, `closed_on_resume` and the task's
id are saved under `_gf_`. Every row and materialized input names its agent, `agent_ref`
`{"name": <agent_name>}`, what NeMo Gym's aggregation groups a run's rows by; a resumed run keeps the
name its materialized inputs give each rollout. No row is stamped `_ng_environment_server`: the
collector sends to the agent itself, through no environment server, so that stamp would be untrue.

Protocol with the agent server: `POST <agent_url>/run` with the JSON body
`{"task": <input row>, "rollout_id": "<task>:<rollout>", "attempt": <n>}`; the reply is a
`BaseEpisodeResponse` (exactly one of `result` or `failure`, and `failure_report`), with the
`X-NG-Failure-Report` header. A non-2xx reply is the agent's failure (rebuilt with
`raise_boundary_failure`); a reply that never arrives is the collector's own failure, of boundary
`collection` and a transport kind, with the transport error as its cause. That is the `gym-failures`
agent protocol; with `agent_protocol` `nemo-gym` the collector speaks NeMo Gym's own agents' `/run`
instead, the hooks `_payload`, `_read` and `_result_row` of `NemoGymDispatcher`
(`gym_failures.collection._nemo_gym_protocol`).

The collector's own failures, each recorded as a failed attempt (retried within the budget), never
raised out of the run:

- A reply that cannot be read as HTTP (an `aiohttp.ClientError` the transport mapping does not name,
  such as aiohttp's refusal of a header line over 8190 bytes) or a 2xx reply that is no valid episode
  response, or whose reward is not a finite number (`NaN` is not a reward a trainer can use; no
  result is saved with it): `environment_protocol_violation`. The reason names the error's type,
  never its text, which quotes the reply's bytes.
- Any other exception while one attempt is dispatched or read (a fault of the collector itself):
  `collection_dispatch_failed`, logged with its traceback. One rollout's fault never cancels the
  others.

An error while saving a row (a full disk) is not an attempt's outcome: it ends the run and is raised
to the caller; the other workers are cancelled, and the attempts they had in flight have no row and
are dispatched again, under the same attempt numbers, on resume (as after a kill).

Reports: the reply's body report (`failure_report`) and its header report describe the same attempt
and are merged. A report over 4096 bytes travels in the header as `{"omitted": true}` alone, while
the body carries it whole: when the body has a report, that header-only marker is not merged (the
body's own `omitted` flag says whether events were lost); events in the header still are.

Retries: a failure with `terminal=True` is final at once; any other is retried until the rollout has
used `max_attempts` attempts (3, or NeMo Gym's `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`), and the last failure
row then says `attempt_budget_exhausted`. What the collector saw decides what may be replayed: an
attempt never sent is always retried; one that may have reached the agent (timed out or reset after
sending) is retried unless `replay_possibly_delivered` is False, when it is final
(`possibly_delivered`).

Pacing (`gym_failures.collection._pacing`): a retried rollout waits before its next attempt, the
backoff (`backoff_initial_s`, `backoff_max_s`) or the failure's own hint (`Retry-After`, a quota's
reset; at most `retry_after_max_s`), written on its failure row as `_gf_retry_wait_s` and
`_gf_retry_wait_from`; while it waits it holds no worker. With `wait_ready_s`, no attempt is sent until
the agent accepts a connection, at the start and after `TRANSPORT_RUN` attempts in a row failed with
the same transport kind; an agent that accepts none within `wait_ready_s` ends the run (`AgentDown`),
the rollouts not yet final kept. A resume with a larger `max_attempts` reopens the rollouts the budget
closed (and, with `retry_terminal`, those closed as terminal), continuing their attempt numbers.

Each failure row carries the attempt's `RolloutFailure` record (`rollout_failure`): `source`
`environment` when the agent answered with the failure, `collector` otherwise; `delivery` from the
client's `HttpDetails.delivery` (`not_sent`, `unknown` -> `possibly_delivered`, `answered` ->
`delivered`); the reply's status; the error's type. A failed reply without a report keeps its
redacted body excerpt (at most 512 characters, the agent URL's own secrets removed too) under
`_ng_failure_response_body`. Every row carries NeMo Gym's keys beside ours (docs/rows.md), and is
written at one place (`Collector._save`).

Who does what: an `AttemptDispatcher` sends one attempt and builds its row (it decides from the
budget whether the row is final); the `Collector` keeps the queue, the budgets, the lock, the
manifest and every row (`record`, then `_save`). The dispatcher runs in the collector's process, or
in Ray workers (`gym_failures.ray.RayCollector`), whose rows come back to the same `record`.

Resume: both output files are read, in any form NeMo Gym or gym-failures wrote
(`gym_failures.rows.normalized`; rows NeMo Gym marked never to be saved are ignored and counted); a
rollout with a success row or a final failure row is done, and any other continues at its next attempt
number: one past the highest attempt, or past its number of failure rows when that is more (older NeMo
Gym rows carry no attempt index), which is NeMo Gym's `_ng_attempt_index` continued. An output NeMo Gym
wrote has no manifest: a resume accepts it when its materialized inputs exist or its first row is NeMo
Gym's (its `_ng_task_index`, no `rollout_id`), and writes the manifest from then on.
A rollout whose recorded attempts already use up
`max_attempts` (lowered since the earlier run) is not dispatched again: a copy of its last failure row
closes it (`final_reason` `attempt_budget_exhausted`, `closed_on_resume` true).

The manifest, `<output>.manifest.json`, holds the digest of the input file and `num_repeats` (the
run's identity), `expected_rollouts` (the rollouts of its inventory, which `gym-failures gate` reads as
the rollouts expected) and its `version` (3; a version 2 run resumes, and keeps its version: its
numbering). Resuming against a different identity is refused with `collection_resume_refused`
unless `force_resume` is set; only the identity is compared, so a manifest written before
`expected_rollouts` existed still resumes. `max_attempts`, the concurrency and the agent URL may
change between runs; no endpoint or credential is written to the manifest. The manifest is replaced
atomically (a temporary file, then `os.replace`), never left half written.

One collector per output: a run holds an exclusive `flock` on `<output>.lock` from start to end, and a
second collector on the same output is refused at once with `collection_resume_refused` (which
`force_resume` does not override). The lock file stays after the run; removing it could let two runs
lock two different files. `flock` is POSIX: collection runs on Linux and macOS.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import yarl
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from gym_failures import nemo_gym
from gym_failures.client import map_transport_errors, raise_boundary_failure
from gym_failures.collection._pacing import (
    Backoff,
    Clock,
    RealClock,
    WaitFrom,
    accepts_connections,
    retry_hint,
)
from gym_failures.collection._protocols import GYM_FAILURES_PROTOCOL, NEMO_GYM_PROTOCOL, AgentProtocol
from gym_failures.failure_kinds import (
    COLLECTION_DISPATCH_FAILED,
    COLLECTION_RESUME_REFUSED,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    TRANSPORT_LOCAL_RESOURCE,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureReportRow, RequestFailureLog
from gym_failures.failures import (
    CollectionFailure,
    HttpDetails,
    NgFailureEvent,
    bounded_text,
    exception_type_name,
    new_event_id,
)
from gym_failures.materialized import (
    LINES,
    MATERIALIZED_SUFFIX,
    NEMO_GYM,
    MaterializedRollout,
    MaterializedScan,
    Numbering,
    count_tasks,
    materialize,
    materialized_path,
    read_materialized,
    task_of,
    write_materialized,
)
from gym_failures.redaction import redact, redact_values, url_secrets, url_without_secrets
from gym_failures.reply import own_chain
from gym_failures.rollout_failure import Delivery, EpisodeId, RolloutFailure, delivery_of
from gym_failures.row_keys import FINAL, FINAL_REASON, RETRY_WAIT_FROM, RETRY_WAIT_S, TASK_ID, saved
from gym_failures.rows import (
    FAILURES_SUFFIX,
    JsonlScan,
    RowWriter,
    TaskScan,
    failures_path,
    is_rollout_row,
    manifest_path,
    read_rows,
    repair_torn_tail,
    rollout_id,
    run_rows_file,
)
from gym_failures.telemetry import CollectionProgress, RolloutOutcome, record_rollout, rollout_outcome

LOGGER = logging.getLogger("gym_failures.collection")

MANIFEST_VERSION = 3
"""Version 3 numbers tasks as NeMo Gym does (`gym_failures.materialized`); version 2 numbered lines,
and a version 2 run still resumes with its own numbering."""
_NUMBERING: dict[int, Numbering] = {2: LINES, 3: NEMO_GYM}
"""Each resumable manifest version's task numbering, used when its run has no materialized inputs."""
_IDENTITY = ("input_sha256", "num_repeats")
"""The manifest's fields that name the run; only these must match to resume."""


BACKOFF_INITIAL_ENV = "GYM_FAILURES_BACKOFF_INITIAL_S"
WAIT_READY_ENV = "GYM_FAILURES_WAIT_READY_S"
DEFAULT_BACKOFF_INITIAL_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_RETRY_AFTER_MAX_S = 300.0
DEFAULT_WAIT_READY_S = 60.0
TRANSPORT_RUN = 3
"""Attempts in a row, across rollouts, failed by the collector with the same transport kind: dispatch
pauses and probes the agent (`wait_ready_s`) before the next."""
_TRANSPORT_KINDS = frozenset(
    {TRANSPORT_UNREACHABLE, TRANSPORT_PEER_DROP, TRANSPORT_TIMEOUT, TRANSPORT_LOCAL_RESOURCE}
)
READY_PROBE_INTERVAL_S = 0.5
"""Between two readiness probes (NeMo Gym's own client waits 0.5 s between connection retries)."""


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
    retry_terminal: bool = False
    """Reopen, on resume, the rollouts closed by a failure the agent marked `terminal` (within the
    budget); the rollouts closed by the budget are reopened whenever `max_attempts` is raised."""
    agent_protocol: AgentProtocol = GYM_FAILURES_PROTOCOL
    """What `/run` the agent speaks: `gym-failures` (the protocol above), or `nemo-gym`, NeMo Gym's own
    agents' `/run` (`gym_failures.collection._nemo_gym_protocol`: the materialized row in, the flat
    verify response out, stored as NeMo Gym stores it)."""

    @field_validator("output_path")
    @classmethod
    def _rows_file(cls, value: Path, info: ValidationInfo) -> Path:
        tasks = info.data.get("input_path")
        tasks = tasks.resolve() if isinstance(tasks, Path) else None
        rows = cls._run_directory(value, tasks)
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


@dataclass
class CollectionSummary:
    """What a run did, and what it found on disk when it started."""

    expected: int = 0
    already_done: int = 0
    succeeded: int = 0
    failed_final: int = 0
    closed_on_resume: int = 0
    """Rollouts closed without a dispatch: their attempts already used up a lowered budget."""
    reopened: int = 0
    """Rollouts an earlier run closed (by the budget, or as terminal with `retry_terminal`) tried again:
    the budget is now larger than their attempts."""
    attempts: int = 0
    dispatch_errors: int = 0
    """Attempts recorded as `collection_dispatch_failed`: an unexpected fault of the collector."""
    torn_lines: int = 0
    invalid_lines: int = 0
    tasks: int = 0
    blank_task_lines: int = 0
    invalid_task_lines: int = 0
    not_persisted_rows: int = 0
    """Rows on disk that NeMo Gym marked never to be saved: ignored by the resume."""
    invalid_materialized_lines: int = 0
    """Lines of the run's materialized inputs that name no rollout (or one already named): skipped."""
    omitted: int = 0
    """Attempts whose reply NeMo Gym's protocol marks never to be saved (`_ng_no_persist`): no row."""
    scans: list[JsonlScan] = field(default_factory=list)


@dataclass
class PendingRollout:
    """A rollout without a final outcome, and the attempt number it continues at."""

    task_index: int
    rollout_index: int
    task: dict[str, Any]
    next_attempt: int
    agent_name: str = "agent"
    """Its rows' `agent_ref.name`."""
    materialized: dict[str, Any] = field(default_factory=dict)
    """Its materialized row, as the run's materialized inputs hold it: what the `nemo-gym` protocol sends."""


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive(config: CollectionConfig) -> Iterator[None]:
    """Hold the output's lock for the block, or refuse at once when another collector holds it."""
    path = config.lock_path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            who = f"process {holder}" if holder.isdigit() else "it"
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"another collector is writing {config.output_path} ({who} holds {path}); "
                    "wait for it to end, or collect into another output path"
                ),
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def _bounded_report(report: FailureReport) -> FailureReport:
    """`report` within the per-request log's `MAX_EVENTS`: an agent's body report has no header bound,
    and an agent can send any number of events. Past the bound, the failure's own chain is kept (cut at
    the bound, its last kept event unlinked from what was cut) and the report marked omitted."""
    if len(report.events) <= RequestFailureLog.MAX_EVENTS:
        return report
    chain = own_chain(report)
    kept = dict(list(chain.events.items())[: RequestFailureLog.MAX_EVENTS]) if chain is not None else {}
    for event_id, event in kept.items():
        if event.cause_id is not None and event.cause_id not in kept:
            kept[event_id] = event.model_copy(update={"cause_id": None})
    failure_id = report.failure_id if report.failure_id in kept else None
    return FailureReport.model_construct(events=kept, failure_id=failure_id, omitted=True)


def _run_url(agent_url: str) -> str:
    """`<agent_url>/run`, the path joined before a query string the URL carries (a token), not into it."""
    parts = urlsplit(agent_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/run"))


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` at once: a reader (or a crash) sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _written_by_nemo_gym(config: CollectionConfig) -> bool:
    """Whether the output's first row is NeMo Gym's: its indices, and no rollout id of ours."""
    for path in (config.output_path, config.failures_path):
        if not path.exists():
            continue
        with path.open("rb") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    return False
                return isinstance(row, dict) and nemo_gym.TASK_INDEX in row and "rollout_id" not in row
    return False


@dataclass(frozen=True)
class _Manifest:
    """What the manifest check decided: the run's id, its manifest version and identity."""

    run_id: str
    version: int
    identity: dict[str, Any]
    forced: bool = False
    """Resumed, by `force_resume`, against an input or `num_repeats` other than the manifest's: the
    inventory is the input's, materialized again."""


def _check_manifest(config: CollectionConfig) -> _Manifest:
    """Refuse to resume another run's output (unless forced); the run's id (kept from the manifest on
    a resume) and the manifest version it goes on with (a version 2 run keeps its version: its
    numbering)."""
    identity = {"input_sha256": _digest(config.input_path), "num_repeats": config.num_repeats}
    path = config.manifest_path
    run_id: str | None = None
    version = MANIFEST_VERSION
    same = True
    if path.exists():
        try:
            found = json.loads(path.read_bytes())
        except (ValueError, RecursionError):
            found = None
        same = isinstance(found, dict) and all(found.get(key) == identity[key] for key in _IDENTITY)
        if not same and not config.force_resume:
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"{config.output_path} was collected from a different input or num_repeats "
                    "(manifest differs); use a new output path, or force the resume"
                ),
            )
        found_version = found.get("version") if isinstance(found, dict) else None
        if type(found_version) is int and found_version in _NUMBERING:
            version = found_version
        elif not config.force_resume:
            # Version 1 numbered tasks by valid row: its rollout ids can differ from any numbering now.
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"{config.output_path} was collected by an earlier version that numbered tasks "
                    "differently; use a new output path, or force the resume"
                ),
            )
        kept = found.get("run_id") if isinstance(found, dict) else None
        run_id = kept if isinstance(kept, str) and 0 < len(kept) <= 128 else None
    elif config.output_path.exists() or config.failures_path.exists():
        if config.materialized_path.exists() or _written_by_nemo_gym(config):
            # NeMo Gym writes no manifest; its materialized inputs (or its rows' own indices, numbered
            # as NeMo Gym numbers the same input) name its rollouts, so the resume goes on as its own.
            LOGGER.info("%s: resuming a NeMo Gym run (no manifest)", config.output_path)
        elif not config.force_resume:
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=f"{config.output_path} exists without a manifest; force the resume",
            )
    return _Manifest(run_id or new_event_id(), version, identity, forced=not same)


def _write_manifest(config: CollectionConfig, manifest: _Manifest, expected: int) -> None:
    """Write the run's manifest (replaced atomically)."""
    document = {
        "version": manifest.version,
        **manifest.identity,
        "expected_rollouts": expected,
        "run_id": manifest.run_id,
        "agent_protocol": config.agent_protocol,
    }
    _write_atomic(config.manifest_path, json.dumps(document, indent=2) + "\n")


def _inventory(
    config: CollectionConfig, manifest: _Manifest, summary: CollectionSummary
) -> list[MaterializedRollout]:
    """Every rollout of the run: on a resume (rows, sidecar or manifest there), its materialized
    inputs when they exist (NeMo Gym's run or ours: the inventory and numbering, kept as they are,
    unless a resume was forced against another input); else the input numbered as the manifest's
    version numbers it and materialized, before the first dispatch, so that NeMo Gym's resume takes
    the run as its own. A fresh run replaces a leftover materialized file, as NeMo Gym's does
    (`nemo_gym/rollout_collection.py:2385`): its tasks are the input's, not the file's."""
    scan = TaskScan(config.input_path)
    path = config.materialized_path
    numbering = _NUMBERING[manifest.version]
    resuming = any(
        found.exists() for found in (config.output_path, config.failures_path, config.manifest_path)
    )
    if path.exists() and not resuming:
        LOGGER.info("%s: a fresh run: leftover materialized inputs replaced from %s", path, config.input_path)
    if path.exists() and resuming and not manifest.forced:
        count_tasks(config.input_path, numbering, scan)  # counted only: the inventory is the materialized one
        materialized_scan = MaterializedScan(path)
        rollouts = read_materialized(path, materialized_scan)
        summary.invalid_materialized_lines = len(materialized_scan.invalid_lines)
    else:
        rollouts = materialize(config.input_path, config.num_repeats, config.agent_name, numbering, scan)
        write_materialized(path, rollouts)
    summary.tasks = scan.tasks
    summary.blank_task_lines = scan.blank_lines
    summary.invalid_task_lines = len(scan.invalid_lines)
    named = "agent_name" in config.model_fields_set
    others = {rollout.agent_name for rollout in rollouts} - {None, config.agent_name}
    if named and others:
        LOGGER.warning(
            "%s: its materialized inputs name the agent %s; its rows keep that name, not %r",
            config.output_path,
            ", ".join(repr(name) for name in sorted(others, key=str)),
            config.agent_name,
        )
    return rollouts


def _pending(
    config: CollectionConfig, inventory: list[MaterializedRollout], summary: CollectionSummary
) -> tuple[list[PendingRollout], list[dict[str, Any]]]:
    """Every rollout without a final outcome, at its next attempt number; and the rows that close
    the rollouts whose recorded attempts already use up the budget.

    A rollout closed by the budget (`attempt_budget_exhausted`) is reopened when the budget is now
    larger than its attempts, as NeMo Gym's resume does (nemo_gym/rollout_collection.py:2299, which
    gates only successes, terminal rows and rollouts at the budget); one closed as `terminal` too when
    `retry_terminal` is set; one closed as `possibly_delivered` never.

    A rollout has used as many attempts as its highest attempt number, or as its failure rows when
    they are more (NeMo Gym's rule, one attempt per sidecar row: older rows carry no attempt index).
    """
    done: set[str] = set()
    attempts: dict[str, int] = {}
    failure_rows: Counter[str] = Counter()
    # Why each rollout was closed by a final failure row (every such row's reason).
    closed: dict[str, set[object]] = {}
    # The last failure row of each rollout not yet done: what closes it when its budget is spent.
    last: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in (config.output_path, config.failures_path):
        torn = repair_torn_tail(path)
        summary.torn_lines += torn is not None
        scan = JsonlScan(path)
        for row in read_rows(path, scan, config.max_attempts):
            key = row.get("rollout_id")
            if not is_rollout_row(row) or not isinstance(key, str):
                continue
            attempt = row.get("attempt")
            attempt = attempt if type(attempt) is int else 0
            attempts[key] = max(attempts.get(key, 0), attempt)
            if "failure" not in row:
                done.add(key)
                continue
            failure_rows[key] += 1  # NeMo Gym counts every sidecar row as an attempt, a final one too
            if row.get("final") is True:
                closed.setdefault(key, set()).add(row.get("final_reason"))
                continue
            if key not in last or attempt >= last[key][0]:
                last[key] = (attempt, row)
        summary.invalid_lines += len(scan.invalid_lines)
        summary.not_persisted_rows += scan.not_persisted
        summary.scans.append(scan)
    reopenable = {"attempt_budget_exhausted", *(("terminal",) if config.retry_terminal else ())}
    for key, reasons in closed.items():
        if key in done:
            continue
        if reasons <= reopenable and max(attempts.get(key, 0), failure_rows[key]) < config.max_attempts:
            summary.reopened += 1
        else:
            done.add(key)
    rollouts: list[PendingRollout] = []
    closing: list[dict[str, Any]] = []
    for item in inventory:
        key = rollout_id(item.task_index, item.rollout_index)
        agent = item.agent_name or config.agent_name
        summary.expected += 1
        if key in done:
            summary.already_done += 1
            continue
        used = max(attempts.get(key, 0), failure_rows[key])
        if used >= config.max_attempts and key in last:
            closing.append(
                saved(
                    {
                        **last[key][1],
                        nemo_gym.AGENT_REF: {"name": agent},
                        "final": True,
                        "final_reason": "attempt_budget_exhausted",
                        "closed_on_resume": True,
                    }
                )
            )
            continue
        rollouts.append(
            PendingRollout(item.task_index, item.rollout_index, task_of(item.row), used + 1, agent, item.row)
        )
    return rollouts, closing


def _base_row(rollout: PendingRollout, attempt: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "rollout_id": rollout_id(rollout.task_index, rollout.rollout_index),
        **nemo_gym.success_keys((rollout.task_index, rollout.rollout_index), attempt, rollout.agent_name),
    }
    task_id = rollout.task.get("id", rollout.task.get("task_id"))
    if task_id is not None:
        row[TASK_ID] = task_id
    return row


_RESULT_KEYS_AT_TOP = ("mask_sample", "failure_kind", "failure_reason")
"""A result's keys NeMo Gym reads at the top level of a completed row (besides `reward` and `response`)."""


def _success_fields(result: dict[str, Any]) -> dict[str, Any]:
    """A success row's outcome keys: `result`, with `reward` beside it and `response` moved beside it,
    where NeMo Gym reads them (`gym_failures.nemo_gym`; the response is large and saved once), and
    copies of the result's metrics where NeMo Gym averages them (`nemo_gym.result_metrics`). A result
    without a reward has no `reward` key: NeMo Gym scores one that is there, even null, as 0
    (`nemo_gym/rollout_collection.py:2757`)."""
    kept = dict(result)
    fields: dict[str, Any] = {"reward": kept["reward"]} if "reward" in kept else {}
    if "response" in kept:
        fields["response"] = kept.pop("response")
    for key in _RESULT_KEYS_AT_TOP:
        if key in kept:
            fields[key] = kept[key]
    return {"result": kept, **nemo_gym.result_metrics(kept), **fields}


@dataclass(frozen=True)
class _Seen:
    """What the collector saw of one attempt's exchange: who failed it and whether it was delivered."""

    source: Literal["environment", "collector"]
    delivery: Delivery
    http_status: int | None = None
    exception_type: str | None = None
    body_excerpt: str = ""
    retry_hint_s: float | None = None
    """What the failure's hints ask to wait (`gym_failures.collection._pacing.retry_hint`)."""


AttemptSeen = _Seen
"""What the collector saw of one attempt's exchange, by the name the protocol hooks' overrides use."""


def _seen(failure: NgFailureEvent, agent_url: str) -> _Seen:
    """`failure`'s source and delivery, from the HTTP details the client helpers kept on it."""
    details = failure.http_details
    source: Literal["environment", "collector"] = (
        "collector" if failure.boundary is FailureBoundary.COLLECTION else "environment"
    )
    # A failure the collector raised without a reply in hand (its own fault) may have been sent.
    delivery = delivery_of(details.delivery) if details is not None else "possibly_delivered"
    if source == "environment":
        delivery = "delivered"  # the environment's own failure reached the collector in a reply
    status = details.status if details is not None else None
    excerpt = ""
    if details is not None and details.body_excerpt and failure.remote_report is None:
        # A failed reply without a report: its body is the only account of the failure. Already
        # redacted and bounded by the client; the agent URL's own secrets are removed too.
        excerpt = bounded_text(redact(details.body_excerpt, url_secrets(agent_url)), 512)
    return _Seen(
        source=source,
        delivery=delivery,
        http_status=status if status is not None and 100 <= status <= 599 else None,
        exception_type=failure.exception_type,
        body_excerpt=excerpt,
        retry_hint_s=retry_hint(failure, None, FailureReport()),
    )


def _episode_failure(failure: NgFailureEvent) -> EpisodeFailure:
    event = failure.to_event()
    return EpisodeFailure(
        failure_kind=event.failure_kind,
        failure_reason=event.failure_reason,
        stage=event.stage,
        terminal=False,
    )


@dataclass(frozen=True)
class AttemptRow:
    """One dispatched attempt's row, not yet saved, and what it means for its rollout."""

    row: dict[str, Any]
    succeeded: bool
    """A success row (saved to the output); else a failure row (saved to the failures sidecar)."""
    final: bool
    """No attempt follows: the rollout is done."""
    dispatch_error: bool = False
    """Recorded as `collection_dispatch_failed`: a fault of the collector, or a worker lost."""
    retry_hint_s: float | None = None
    """The wait the failure asked for (its `Retry-After`, a quota's reset), unbounded yet; else None."""
    transport_kind: str | None = None
    """The transport failure kind of a failure the collector saw itself (no reply came), else None."""
    persisted: bool = True
    """False for a NeMo Gym reply marked never to be saved (`_ng_no_persist`): no row is written, the
    attempt is counted as omitted, and the rollout waits for a resume, as NeMo Gym leaves it."""


AttemptFunction = Callable[[PendingRollout, int], Awaitable[AttemptRow]]
"""Dispatch attempt `n` of a rollout and return its row; never raises for a failed attempt."""


@dataclass(frozen=True)
class Retry:
    """A failed attempt's rollout goes on: after `wait_s` seconds, from `wait_from`."""

    wait_s: float
    wait_from: WaitFrom


class AgentDown(CollectionFailure):
    """The agent accepted no connection within `wait_ready_s`: the run ended, its open rollouts kept."""


class _Schedule:
    """Which rollout attempts are ready to send, and whether dispatch is paused for the agent.

    Retries come before rollouts not yet tried; a rollout backing off is in neither until its wait
    ends, so it holds no worker. `take` waits for one ready while dispatch is open."""

    def __init__(self, rollouts: list[PendingRollout], paused: bool) -> None:
        self.fresh: collections.deque[tuple[PendingRollout, int]] = collections.deque(
            (rollout, rollout.next_attempt) for rollout in rollouts
        )
        self.retries: collections.deque[tuple[PendingRollout, int]] = collections.deque()
        self.open = len(rollouts)
        self.paused = paused
        """No attempt is sent: the agent is being probed (`Collector._watch_agent`)."""
        self.stopped = False
        self.untried = {id(rollout) for rollout in rollouts}
        """The rollouts not sent an attempt yet in this run."""
        self.backing_off: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Condition()
        self.streak: tuple[str | None, int] = (None, 0)

    def _takeable(self) -> bool:
        return self.stopped or self.open == 0 or (not self.paused and bool(self.retries or self.fresh))

    async def take(self) -> tuple[PendingRollout, int] | None:
        """The next attempt to send, or None when the run has no more (done, or stopped)."""
        async with self.changed:
            await self.changed.wait_for(self._takeable)
            if self.stopped or self.open == 0:
                return None
            rollout, attempt = self.retries.popleft() if self.retries else self.fresh.popleft()
            self.untried.discard(id(rollout))
            return rollout, attempt

    async def settle(self, rollout: PendingRollout, attempt: int, retry: Retry | None, clock: Clock) -> None:
        """An attempt was recorded: its rollout is done, or ready again after its wait."""
        if retry is None:
            async with self.changed:
                self.open -= 1
                self.changed.notify_all()
        elif retry.wait_s <= 0:
            await self.ready(rollout, attempt + 1)
        else:
            task = asyncio.create_task(self._after(retry.wait_s, rollout, attempt + 1, clock))
            self.backing_off.add(task)
            task.add_done_callback(self.backing_off.discard)

    async def _after(self, wait_s: float, rollout: PendingRollout, attempt: int, clock: Clock) -> None:
        await clock.sleep(wait_s)
        await self.ready(rollout, attempt)

    async def ready(self, rollout: PendingRollout, attempt: int) -> None:
        async with self.changed:
            self.retries.append((rollout, attempt))
            self.changed.notify_all()

    async def pause(self) -> None:
        async with self.changed:
            self.paused = True
            self.changed.notify_all()

    async def resume(self, up: bool) -> None:
        """The probe ended: dispatch goes on when the agent is `up`, else the run stops."""
        async with self.changed:
            self.paused = False
            self.stopped = not up
            self.streak = (None, 0)
            self.changed.notify_all()

    def cancel(self) -> None:
        for task in self.backing_off:
            task.cancel()


class Collector:
    """Run one collection: `await Collector(config).run()`.

    The collector keeps the queue, the attempt budgets, the rows and the resume; what dispatches one
    attempt (`dispatcher`) is an `AttemptDispatcher` in this process, or Ray workers
    (`gym_failures.ray.RayCollector`), each row coming back to the one `_save` point. `clock` is what
    it waits on (backoff, readiness): the loop's own, or a test's.
    """

    paces_retries = True
    """Whether a retried rollout waits (backoff, hints) before its next attempt, and the row says so."""

    def __init__(
        self,
        config: CollectionConfig,
        on_progress: Callable[[CollectionProgress], None] | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.on_progress = on_progress
        """Called with `progress` after every change: the live view's one hook."""
        self.clock: Clock = clock or RealClock()
        self.summary = CollectionSummary()
        self.progress = CollectionProgress()
        self._secrets = url_secrets(config.agent_url)
        self._backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
        self.run_id = ""
        """The run's id (the manifest's), known once `run` has checked the manifest."""

    async def run(self) -> CollectionSummary:
        config = self.config
        with _exclusive(config):
            manifest = _check_manifest(config)
            self.run_id = manifest.run_id
            inventory = _inventory(config, manifest, self.summary)
            _write_manifest(config, manifest, len(inventory))
            rollouts, closing = _pending(config, inventory, self.summary)
            self.progress.expected = self.summary.expected
            self.progress.already_done = self.summary.already_done
            self.progress.reopened = self.summary.reopened
            self._progress()
            with RowWriter(config.output_path) as successes, RowWriter(config.failures_path) as failures:
                for row in closing:
                    self._save(failures, row, dispatched=False)
                    self.summary.failed_final += 1
                    self.summary.closed_on_resume += 1
                await self.dispatch_rollouts(rollouts, successes, failures)
        return self.summary

    def in_flight(self) -> int:
        """How many attempts are dispatched at once: the concurrency, in this process."""
        return self.config.concurrency

    @contextlib.asynccontextmanager
    async def dispatcher(self) -> AsyncIterator[AttemptFunction]:
        """What dispatches one attempt, for the run's duration: here, this process's client session."""
        async with dispatcher_for(self.config, self.run_id) as dispatcher:
            yield dispatcher.row

    async def dispatch_rollouts(
        self, rollouts: list[PendingRollout], successes: RowWriter, failures: RowWriter
    ) -> None:
        """Bring every rollout to a final outcome, each attempt's row `record`ed here: `in_flight`
        workers, each sending one ready attempt at a time (a rollout backing off holds none); with
        `wait_ready_s`, no attempt is sent until the agent accepts connections, nor after a run of
        transport failures until it does again (`_watch_agent`)."""
        if not rollouts:
            return
        watching = self.config.wait_ready_s > 0
        schedule = _Schedule(rollouts, paused=watching)
        async with self.dispatcher() as attempt:
            tasks = [
                asyncio.create_task(self._worker(attempt, schedule, successes, failures))
                for _ in range(min(self.in_flight(), len(rollouts)))
            ]
            watcher = asyncio.create_task(self._watch_agent(schedule)) if watching else None
            try:
                await asyncio.gather(*tasks)
            finally:
                schedule.cancel()
                for task in (*tasks, *([watcher] if watcher else [])):
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*tasks, *([watcher] if watcher else []), return_exceptions=True)
                self.progress.backing_off = 0
                self.progress.agent_wait_s = None
        if schedule.stopped:
            untried = len(schedule.untried)
            raise AgentDown(
                failure_kind=TRANSPORT_UNREACHABLE,
                failure_reason=(
                    f"the agent at {url_without_secrets(self.config.agent_url)} accepted no connection "
                    f"within {self.config.wait_ready_s:g} s (wait_ready_s); {schedule.open} rollout(s) "
                    f"have no final outcome yet ({untried} never tried, their budgets whole): collect "
                    "again once it is up"
                ),
            )

    async def _watch_agent(self, schedule: _Schedule) -> None:
        """Whenever dispatch is paused (at the start, after a run of transport failures), probe the
        agent until it accepts a connection, then resume; past `wait_ready_s`, stop the run."""
        while True:
            async with schedule.changed:
                await schedule.changed.wait_for(lambda: schedule.paused or schedule.open == 0)
                if schedule.open == 0:
                    return
            await schedule.resume(await self._agent_up())

    async def _agent_up(self) -> bool:
        """Whether the agent accepts a connection within `wait_ready_s` (probed every
        `READY_PROBE_INTERVAL_S`); the wait shows in `progress.agent_wait_s`."""
        clock, bound = self.clock, self.config.wait_ready_s
        started = clock.monotonic()
        connect_s = min(self.config.timeout_s, 10.0)
        # The probes are counted too: the wait ends after the probes `bound` has room for, whatever
        # the clock says (a test's clock, or a clock that stalls, cannot keep it probing for ever).
        probes_left = math.ceil(bound / READY_PROBE_INTERVAL_S) + 1
        try:
            while not await accepts_connections(self.config.agent_url, connect_s):
                waited = clock.monotonic() - started
                probes_left -= 1
                if waited >= bound or probes_left <= 0:
                    return False  # said once, by the run's end (`AgentDown`)
                self.progress.agent_wait_s = waited
                self._progress()
                await clock.sleep(min(READY_PROBE_INTERVAL_S, bound - waited))
            return True
        finally:
            if self.progress.agent_wait_s is not None:
                self.progress.agent_wait_s = None
                self._progress()

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def _save(self, writer: RowWriter, row: dict[str, Any], *, dispatched: bool = True) -> None:
        """Write `row`, then count it: in telemetry when it is an attempt's, and in `progress`. The one
        place a row is written. The collector's own secrets (the agent URL's user info and query values,
        and the Basic credential the client sends for them) are replaced wherever the row holds them:
        an agent's reply may quote the request it was sent."""
        try:
            writer.write(redact_values(row, self._secrets))
        except BaseException:
            if dispatched:
                omitted = RolloutOutcome("omitted", final=False)
                record_rollout(omitted, self.config.agent_name)
                self.progress.add(omitted)
            raise
        outcome = rollout_outcome(row)
        if dispatched:
            record_rollout(outcome, self.config.agent_name)
        self.progress.add(outcome, dispatched=dispatched)
        self._progress()

    async def _worker(
        self, attempt: AttemptFunction, schedule: _Schedule, successes: RowWriter, failures: RowWriter
    ) -> None:
        while (item := await schedule.take()) is not None:
            rollout, number = item
            outcome = await attempt(rollout, number)
            retry = self.record_attempt(outcome, successes, failures)
            if outcome.transport_kind is not None and schedule.streak[0] == outcome.transport_kind:
                schedule.streak = (outcome.transport_kind, schedule.streak[1] + 1)
            else:
                schedule.streak = (outcome.transport_kind, int(outcome.transport_kind is not None))
            if schedule.streak[1] >= TRANSPORT_RUN and self.config.wait_ready_s > 0:
                await schedule.pause()
            await schedule.settle(rollout, number, retry, self.clock)
            self.progress.backing_off = len(schedule.backing_off)

    def record(self, outcome: AttemptRow, successes: RowWriter, failures: RowWriter) -> bool:
        """Save one attempt's row (through `_save`) and count it; whether its rollout goes on."""
        return self.record_attempt(outcome, successes, failures) is not None

    def record_attempt(self, outcome: AttemptRow, successes: RowWriter, failures: RowWriter) -> Retry | None:
        """Save one attempt's row (through `_save`) and count it; whether its rollout goes on, and
        after what wait (written in the row, `_gf_retry_wait_s`, when `paces_retries`)."""
        self.summary.attempts += 1
        self.summary.dispatch_errors += outcome.dispatch_error
        if not outcome.persisted:
            self.summary.omitted += 1
            omitted = RolloutOutcome("omitted", final=False)
            record_rollout(omitted, self.config.agent_name)
            self.progress.add(omitted)
            self._progress()
            return None
        retry: Retry | None = None
        key = str(outcome.row.get("rollout_id"))
        if not outcome.succeeded and not outcome.final:
            retry = self._retry(key, outcome) if self.paces_retries else Retry(0.0, "backoff")
            if self.paces_retries:
                outcome.row[RETRY_WAIT_S] = retry.wait_s
                outcome.row[RETRY_WAIT_FROM] = retry.wait_from
        else:
            self._backoff.forget(key)
        self._save(successes if outcome.succeeded else failures, outcome.row)
        if outcome.succeeded:
            self.summary.succeeded += 1
        elif outcome.final:
            self.summary.failed_final += 1
        return retry

    def _retry(self, key: str, outcome: AttemptRow) -> Retry:
        """The wait before a failed rollout's next attempt: the failure's hint, bounded by
        `retry_after_max_s`, else the backoff."""
        # Rounded to the millisecond: the row says the wait the clock is asked for, exactly.
        if outcome.retry_hint_s is not None:
            hint = min(max(outcome.retry_hint_s, 0.0), self.config.retry_after_max_s)
            return Retry(round(hint, 3), "retry_after")
        return Retry(round(self._backoff.wait(key), 3), "backoff")


class AttemptDispatcher:
    """Dispatch one attempt to the agent and build its row, without saving it: what the collector's
    workers run, in its own process or in a Ray worker (`gym_failures.ray`).

    Use as an async context manager (it holds the client session, at most `concurrency` connections).
    """

    def __init__(self, config: CollectionConfig, run_id: str) -> None:
        self.config = config
        self.run_id = run_id
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AttemptDispatcher:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.config.concurrency)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def row(self, rollout: PendingRollout, attempt: int) -> AttemptRow:
        """Attempt `attempt` of `rollout`: its row; never raises for a failed attempt."""
        assert self._session is not None, "enter the dispatcher first"
        response, report, seen = await self._attempt(self._session, rollout, attempt)
        return self.outcome_row(rollout, attempt, response, report, seen)

    def failure_row(self, rollout: PendingRollout, attempt: int, failure: NgFailureEvent) -> AttemptRow:
        """The row of an attempt that ended in `failure` before any reply was read (a worker lost)."""
        with RequestFailureLog.capture() as log:
            report = log.reply_report(failure)
        response = BaseEpisodeResponse(failure=_episode_failure(failure))
        return self.outcome_row(rollout, attempt, response, report, _seen(failure, self.config.agent_url))

    def outcome_row(
        self,
        rollout: PendingRollout,
        attempt: int,
        response: BaseEpisodeResponse,
        report: FailureReport,
        seen: _Seen,
    ) -> AttemptRow:
        row = _base_row(rollout, attempt)
        if response.result is not None:
            return self._result_row(rollout, attempt, row, response.result, report, seen)
        assert response.failure is not None
        final_reason = self._final_reason(response.failure, seen, attempt)
        failure = response.failure.model_dump(mode="json")
        row["failure"] = failure
        row[FINAL] = final_reason is not None
        row[FINAL_REASON] = final_reason
        row.update(
            nemo_gym.failure_keys(
                failure,
                exception_type=seen.exception_type,
                # NeMo Gym's key is a failed `/run` reply's status (rollout_collection.py:1641): an
                # episode failure answered in a 2xx is no failed reply, and has none.
                http_status=seen.http_status if not _succeeded_status(seen.http_status) else None,
                response_body=seen.body_excerpt,
            )
        )
        # NeMo Gym never retries a terminal row: a failure this collector will not replay is one.
        row[nemo_gym.FAILURE_TERMINAL] = final_reason in ("terminal", "possibly_delivered")
        row["rollout_failure"] = self._record(rollout, attempt, response.failure, seen)
        row.update(FailureReportRow.fields(report))
        kind = response.failure.failure_kind
        dispatch_error = seen.source == "collector" and kind == COLLECTION_DISPATCH_FAILED
        hint = seen.retry_hint_s
        if hint is None and seen.source == "environment":
            hint = retry_hint(None, response.failure, report)
        return AttemptRow(
            row,
            succeeded=False,
            final=final_reason is not None,
            dispatch_error=dispatch_error,
            retry_hint_s=hint,
            transport_kind=kind if seen.source == "collector" and kind in _TRANSPORT_KINDS else None,
        )

    def _result_row(
        self,
        rollout: PendingRollout,
        attempt: int,
        row: dict[str, Any],
        result: dict[str, Any],
        report: FailureReport,
        seen: _Seen,
    ) -> AttemptRow:
        """The row of an attempt the agent answered with a result (`row` holds the base keys)."""
        row.update(_success_fields(result))
        row.update(FailureReportRow.fields(report))
        return AttemptRow(row, succeeded=True, final=True)

    def _payload(self, rollout: PendingRollout, attempt: int) -> dict[str, Any]:
        """The `/run` body of attempt `attempt` of `rollout`."""
        return {
            "task": rollout.task,
            "rollout_id": rollout_id(rollout.task_index, rollout.rollout_index),
            "attempt": attempt,
        }

    def _read(self, body: bytes, url: str) -> BaseEpisodeResponse:
        """A 2xx reply's `body` as an episode response (a `CollectionFailure` when it is none)."""
        return read_episode_response(body, url)

    def _final_reason(self, failure: EpisodeFailure, seen: _Seen, attempt: int) -> str | None:
        """Why no attempt follows this failed one, or None when the rollout is retried."""
        if failure.terminal:
            return "terminal"
        if seen.delivery == "possibly_delivered" and not self.config.replay_possibly_delivered:
            return "possibly_delivered"
        if attempt >= self.config.max_attempts:
            return "attempt_budget_exhausted"
        return None

    def _record(
        self, rollout: PendingRollout, attempt: int, failure: EpisodeFailure, seen: _Seen
    ) -> dict[str, Any]:
        """The attempt's `RolloutFailure` record, as JSON."""
        record = RolloutFailure(
            episode_id=EpisodeId.of(rollout_id(rollout.task_index, rollout.rollout_index), attempt),
            run_id=self.run_id,
            source=seen.source,
            delivery=seen.delivery,
            failure=failure,
            http_status=seen.http_status,
            exception_type=None if seen.exception_type is None else seen.exception_type[:2000],
        )
        data: dict[str, Any] = record.model_dump(mode="json", exclude_none=True)
        return data

    async def _attempt(
        self, session: aiohttp.ClientSession, rollout: PendingRollout, attempt: int
    ) -> tuple[BaseEpisodeResponse, FailureReport, _Seen]:
        """One attempt's outcome, the report observed for it and what the collector saw of the
        exchange; never raises for a failed attempt."""
        url = _run_url(self.config.agent_url)
        payload = self._payload(rollout, attempt)
        with RequestFailureLog.capture() as log:
            try:
                response, status = await self._exchange(session, url, payload)
            except NgFailureEvent as failure:
                return (
                    BaseEpisodeResponse(failure=_episode_failure(failure)),
                    log.reply_report(failure),
                    _seen(failure, self.config.agent_url),
                )
            seen = _Seen(source="environment", delivery="delivered", http_status=status)
            header = log.report
            body = response.failure_report
            if body is None:
                return response, header, seen
            if header.omitted and not header.events:
                # The header said `{"omitted": true}` alone: the report was too large for it, and the
                # body carries it whole, with its own `omitted` flag.
                header = FailureReport()
            return response, _bounded_report(body.merged(header)), seen

    async def _exchange(
        self, session: aiohttp.ClientSession, url: str, payload: dict[str, Any]
    ) -> tuple[BaseEpisodeResponse, int]:
        """Send one attempt and read its episode response and HTTP status; any failure is raised as a
        Gym failure, with what was seen of the exchange in its `http_details`."""
        safe_url = url_without_secrets(url)
        target = f"POST {safe_url}"
        status: int | None = None
        try:
            try:
                with map_transport_errors("collection", method="POST", url=url):
                    async with session.post(url, json=payload) as reply:
                        status = reply.status
                        await raise_boundary_failure(reply, boundary="agent")
                        body = await _bounded_body(reply, self.config.max_reply_bytes, target)
            except aiohttp.ClientError as error:
                # Not a transport failure `map_transport_errors` names: the reply came but could not be
                # read as HTTP (a header line over aiohttp's 8190 bytes, a malformed status line). The
                # error's text quotes the reply's bytes: only its type is kept.
                failure = CollectionFailure(
                    failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                    failure_reason=f"{target}: the reply could not be read ({type(error).__name__})",
                    exception_type=exception_type_name(error),
                )
                failure.http_details = HttpDetails(
                    method="POST", url=safe_url, status=status, delivery="answered"
                )
                raise failure from error
            assert status is not None
            return self._read(body, url), status
        except CollectionFailure as failure:
            if failure.http_details is None and status is not None:
                # A reply came, and the collector refused it: delivered.
                failure.http_details = HttpDetails(
                    method="POST", url=safe_url, status=status, delivery="answered"
                )
            raise
        except NgFailureEvent:
            raise
        except Exception as error:
            LOGGER.exception(
                "%s: unexpected %s in the collector; recorded as a failed attempt",
                target,
                type(error).__name__,
            )
            raise CollectionFailure(
                failure_kind=COLLECTION_DISPATCH_FAILED,
                failure_reason=f"{target}: the collector failed unexpectedly ({type(error).__name__})",
                exception_type=exception_type_name(error),
            ) from error


def dispatcher_for(config: CollectionConfig, run_id: str) -> AttemptDispatcher:
    """The dispatcher of `config`'s agent protocol (`CollectionConfig.agent_protocol`)."""
    if config.agent_protocol == NEMO_GYM_PROTOCOL:
        from gym_failures.collection._nemo_gym_protocol import NemoGymDispatcher

        return NemoGymDispatcher(config, run_id)
    return AttemptDispatcher(config, run_id)


def _succeeded_status(status: int | None) -> bool:
    return status is not None and 200 <= status <= 299


def _answered(safe_url: str, status: int | None) -> HttpDetails:
    return HttpDetails(method="POST", url=safe_url, status=status, delivery="answered")


async def _bounded_body(reply: aiohttp.ClientResponse, limit: int, target: str) -> bytes:
    """The reply's body, refused past `limit` bytes without reading further."""
    if reply.content_length is not None and reply.content_length > limit:
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=f"{target}: the reply's {reply.content_length} bytes are over {limit}",
        )
    body = bytearray()
    while chunk := await reply.content.read(1 << 20):
        body += chunk
        if len(body) > limit:
            raise CollectionFailure(
                failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                failure_reason=f"{target}: the reply is over {limit} bytes",
            )
    return bytes(body)


def read_episode_response(body: bytes, url: str) -> BaseEpisodeResponse:
    """The agent's 2xx reply `body` as an episode response; a `CollectionFailure` when it is none, or
    when its reward is not a finite number."""
    try:
        response = BaseEpisodeResponse.model_validate_json(body)
    except ValidationError as error:
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=(
                f"{url_without_secrets(url)} replied 2xx without a valid episode response "
                f"({error.error_count()} validation error(s))"
            ),
        ) from None
    reward = None if response.result is None else response.result.get("reward")
    if isinstance(reward, float) and not math.isfinite(reward):
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=(
                f"{url_without_secrets(url)} replied a result whose reward is {reward!r}, not a finite number"
            ),
        )
    return response


async def collect(
    config: CollectionConfig,
    on_progress: Callable[[CollectionProgress], None] | None = None,
    *,
    clock: Clock | None = None,
) -> CollectionSummary:
    """Run one collection (resuming what is on disk) and return its summary; `AgentDown` when the
    agent accepts no connection within `wait_ready_s` (the rollouts not yet final are kept)."""
    return await Collector(config, on_progress, clock=clock).run()
