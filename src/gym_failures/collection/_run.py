"""The collector: dispatch rollouts to an agent server, save each attempt's outcome and failure report.

Tasks: the input is JSONL, one task object a line (`read_tasks`). A task's index is its 0-based line
number, every line counted; blank lines and lines that are not a JSON object are skipped and counted
(`CollectionSummary.blank_task_lines`, `invalid_task_lines`). The input is written once and never
appended to, so an unterminated last line is an ordinary task. Tasks are sent as written.

Protocol with the agent server: `POST <agent_url>/run` with the JSON body
`{"task": <input row>, "rollout_id": "<task>:<rollout>", "attempt": <n>}`; the reply is a
`BaseEpisodeResponse` (exactly one of `result` or `failure`, and `failure_report`), with the
`X-NG-Failure-Report` header. A non-2xx reply is the agent's failure (rebuilt with
`raise_boundary_failure`); a reply that never arrives is the collector's own failure, of boundary
`collection` and a transport kind, with the transport error as its cause.

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
used `max_attempts` attempts, and the last failure row then says `attempt_budget_exhausted`.

Resume: both output files are read; a rollout with a success row or a final failure row is done, and
any other continues at its next attempt number. A rollout whose recorded attempts already use up
`max_attempts` (lowered since the earlier run) is not dispatched again: a copy of its last failure row
closes it (`final_reason` `attempt_budget_exhausted`, `closed_on_resume` true).

The manifest, `<output>.manifest.json`, holds the digest of the input file and `num_repeats` (the
run's identity) and `expected_rollouts` (tasks times `num_repeats`, which `gym-failures gate` reads as the
rollouts expected). Resuming against a different identity is refused with `collection_resume_refused`
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
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yarl
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gym_failures.client import map_transport_errors, raise_boundary_failure
from gym_failures.failure_kinds import (
    COLLECTION_DISPATCH_FAILED,
    COLLECTION_RESUME_REFUSED,
    ENVIRONMENT_PROTOCOL_VIOLATION,
)
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, FailureReport
from gym_failures.failure_transport import FailureReportRow, RequestFailureLog
from gym_failures.failures import CollectionFailure, NgFailureEvent, exception_type_name
from gym_failures.redaction import url_without_secrets
from gym_failures.rows import (
    JsonlScan,
    RowWriter,
    TaskScan,
    failures_path,
    manifest_path,
    read_rows,
    read_tasks,
    repair_torn_tail,
    rollout_id,
)
from gym_failures.telemetry import CollectionProgress, RolloutOutcome, record_rollout, rollout_outcome

LOGGER = logging.getLogger("gym_failures.collection")

MANIFEST_VERSION = 2
_IDENTITY = ("input_sha256", "num_repeats")
"""The manifest's fields that name the run; only these must match to resume."""


class CollectionConfig(BaseModel):
    """What one collection run does."""

    # A mistyped agent URL can hold a password: never echo input in a validation error.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    input_path: Path
    output_path: Path
    """`<output>.jsonl`; failures go to `<output>_failures.jsonl` beside it."""
    agent_url: str
    num_repeats: int = Field(default=1, ge=1)
    concurrency: int = Field(default=16, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    max_reply_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """The largest episode reply read; a larger one is the agent's protocol violation, not memory."""
    force_resume: bool = False
    agent_name: str = Field(default="agent", min_length=1, max_length=128)
    """The agent's name in telemetry (`nemo.gym.rollout.dispatch.name`); never its URL."""

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
    attempts: int = 0
    dispatch_errors: int = 0
    """Attempts recorded as `collection_dispatch_failed`: an unexpected fault of the collector."""
    torn_lines: int = 0
    invalid_lines: int = 0
    tasks: int = 0
    blank_task_lines: int = 0
    invalid_task_lines: int = 0
    scans: list[JsonlScan] = field(default_factory=list)


@dataclass
class _Rollout:
    task_index: int
    rollout_index: int
    task: dict[str, Any]
    next_attempt: int


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


def _check_manifest(config: CollectionConfig, expected: int) -> None:
    """Refuse to resume another run's output (unless forced), then write this run's manifest."""
    identity = {"input_sha256": _digest(config.input_path), "num_repeats": config.num_repeats}
    path = config.manifest_path
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
        # Version 1 numbered tasks by valid row, version 2 by line: their rollout ids can differ.
        if isinstance(found, dict) and found.get("version") != MANIFEST_VERSION and not config.force_resume:
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"{config.output_path} was collected by an earlier version that numbered tasks "
                    "differently; use a new output path, or force the resume"
                ),
            )
    elif (config.output_path.exists() or config.failures_path.exists()) and not config.force_resume:
        raise CollectionFailure(
            failure_kind=COLLECTION_RESUME_REFUSED,
            failure_reason=f"{config.output_path} exists without a manifest; force the resume",
        )
    manifest = {"version": MANIFEST_VERSION, **identity, "expected_rollouts": expected}
    _write_atomic(path, json.dumps(manifest, indent=2) + "\n")


def _read_tasks(path: Path, summary: CollectionSummary) -> list[tuple[int, dict[str, Any]]]:
    scan = TaskScan(path)
    tasks = list(read_tasks(path, scan))
    summary.tasks = scan.tasks
    summary.blank_task_lines = scan.blank_lines
    summary.invalid_task_lines = len(scan.invalid_lines)
    return tasks


def _pending(
    config: CollectionConfig, tasks: list[tuple[int, dict[str, Any]]], summary: CollectionSummary
) -> tuple[list[_Rollout], list[dict[str, Any]]]:
    """Every rollout without a final outcome, at its next attempt number; and the rows that close
    the rollouts whose recorded attempts already use up the budget."""
    done: set[str] = set()
    attempts: dict[str, int] = {}
    # The last failure row of each rollout at or past the budget: what closes it if it is not done.
    spent: dict[str, tuple[int, dict[str, Any]]] = {}
    for path in (config.output_path, config.failures_path):
        torn = repair_torn_tail(path)
        summary.torn_lines += torn is not None
        scan = JsonlScan(path)
        for row in read_rows(path, scan):
            key = row.get("rollout_id")
            if not isinstance(key, str):
                continue
            attempt = row.get("attempt")
            if type(attempt) is int:
                attempts[key] = max(attempts.get(key, 0), attempt)
            if "failure" not in row:
                if "result" in row:
                    done.add(key)
            elif row.get("final") is True:
                done.add(key)
            elif (
                type(attempt) is int
                and attempt >= config.max_attempts
                and (key not in spent or attempt >= spent[key][0])
            ):
                spent[key] = (attempt, row)
        summary.invalid_lines += len(scan.invalid_lines)
        summary.scans.append(scan)
    rollouts: list[_Rollout] = []
    closing: list[dict[str, Any]] = []
    for task_index, task in tasks:
        for rollout_index in range(config.num_repeats):
            key = rollout_id(task_index, rollout_index)
            summary.expected += 1
            if key in done:
                summary.already_done += 1
                continue
            last = spent.get(key)
            if last is not None and last[0] >= attempts.get(key, 0):
                closing.append(
                    {
                        **last[1],
                        "final": True,
                        "final_reason": "attempt_budget_exhausted",
                        "closed_on_resume": True,
                    }
                )
                continue
            rollouts.append(_Rollout(task_index, rollout_index, task, attempts.get(key, 0) + 1))
    return rollouts, closing


def _base_row(rollout: _Rollout, attempt: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "task_index": rollout.task_index,
        "rollout_index": rollout.rollout_index,
        "rollout_id": rollout_id(rollout.task_index, rollout.rollout_index),
        "attempt": attempt,
    }
    task_id = rollout.task.get("id", rollout.task.get("task_id"))
    if task_id is not None:
        row["task_id"] = task_id
    return row


def _episode_failure(failure: NgFailureEvent) -> EpisodeFailure:
    event = failure.to_event()
    return EpisodeFailure(
        failure_kind=event.failure_kind,
        failure_reason=event.failure_reason,
        stage=event.stage,
        terminal=False,
    )


class Collector:
    """Run one collection: `await Collector(config).run()`."""

    def __init__(
        self, config: CollectionConfig, on_progress: Callable[[CollectionProgress], None] | None = None
    ) -> None:
        self.config = config
        self.on_progress = on_progress
        """Called with `progress` after every change: the live view's one hook."""
        self.summary = CollectionSummary()
        self.progress = CollectionProgress()

    async def run(self) -> CollectionSummary:
        config = self.config
        with _exclusive(config):
            tasks = _read_tasks(config.input_path, self.summary)
            _check_manifest(config, len(tasks) * config.num_repeats)
            rollouts, closing = _pending(config, tasks, self.summary)
            self.progress.expected = self.summary.expected
            self.progress.already_done = self.summary.already_done
            self._progress()
            with RowWriter(config.output_path) as successes, RowWriter(config.failures_path) as failures:
                for row in closing:
                    self._save(failures, row, dispatched=False)
                    self.summary.failed_final += 1
                    self.summary.closed_on_resume += 1
                await self._dispatch(rollouts, successes, failures)
        return self.summary

    async def _dispatch(self, rollouts: list[_Rollout], successes: RowWriter, failures: RowWriter) -> None:
        config = self.config
        queue: asyncio.Queue[_Rollout] = asyncio.Queue()
        for rollout in rollouts:
            queue.put_nowait(rollout)
        timeout = aiohttp.ClientTimeout(total=config.timeout_s)
        connector = aiohttp.TCPConnector(limit=config.concurrency)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            workers = [
                asyncio.create_task(self._worker(session, queue, successes, failures))
                for _ in range(min(config.concurrency, max(1, len(rollouts))))
            ]
            try:
                await asyncio.gather(*workers)
            finally:
                for worker in workers:
                    worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(*workers, return_exceptions=True)

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def _save(self, writer: RowWriter, row: dict[str, Any], *, dispatched: bool = True) -> None:
        """Write `row`, then count it: in telemetry when it is an attempt's, and in `progress`."""
        try:
            writer.write(row)
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
        self,
        session: aiohttp.ClientSession,
        queue: asyncio.Queue[_Rollout],
        successes: RowWriter,
        failures: RowWriter,
    ) -> None:
        while True:
            try:
                rollout = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await self._rollout(session, rollout, successes, failures)

    async def _rollout(
        self, session: aiohttp.ClientSession, rollout: _Rollout, successes: RowWriter, failures: RowWriter
    ) -> None:
        attempt = rollout.next_attempt
        while True:
            response, report = await self._attempt(session, rollout, attempt)
            self.summary.attempts += 1
            row = _base_row(rollout, attempt)
            if response.result is not None:
                row["result"] = response.result
                row["reward"] = response.result.get("reward")
                row.update(FailureReportRow.fields(report))
                self._save(successes, row)
                self.summary.succeeded += 1
                return
            assert response.failure is not None
            final_reason: str | None = None
            if response.failure.terminal:
                final_reason = "terminal"
            elif attempt >= self.config.max_attempts:
                final_reason = "attempt_budget_exhausted"
            row["failure"] = response.failure.model_dump(mode="json")
            row["final"] = final_reason is not None
            row["final_reason"] = final_reason
            row.update(FailureReportRow.fields(report))
            self._save(failures, row)
            if final_reason is not None:
                self.summary.failed_final += 1
                return
            attempt += 1

    async def _attempt(
        self, session: aiohttp.ClientSession, rollout: _Rollout, attempt: int
    ) -> tuple[BaseEpisodeResponse, FailureReport]:
        """One attempt's outcome and the report observed for it; never raises for a failed attempt."""
        url = self.config.agent_url.rstrip("/") + "/run"
        payload = {
            "task": rollout.task,
            "rollout_id": rollout_id(rollout.task_index, rollout.rollout_index),
            "attempt": attempt,
        }
        with RequestFailureLog.capture() as log:
            try:
                response = await self._exchange(session, url, payload)
            except NgFailureEvent as failure:
                if failure.failure_kind == COLLECTION_DISPATCH_FAILED:
                    self.summary.dispatch_errors += 1
                return (
                    BaseEpisodeResponse(failure=_episode_failure(failure)),
                    log.reply_report(failure),
                )
            header = log.report
            body = response.failure_report
            if body is None:
                return response, header
            if header.omitted and not header.events:
                # The header said `{"omitted": true}` alone: the report was too large for it, and the
                # body carries it whole, with its own `omitted` flag.
                header = FailureReport()
            return response, body.merged(header)

    async def _exchange(
        self, session: aiohttp.ClientSession, url: str, payload: dict[str, Any]
    ) -> BaseEpisodeResponse:
        """Send one attempt and read its episode response; any failure is raised as a Gym failure."""
        target = f"POST {url_without_secrets(url)}"
        try:
            try:
                with map_transport_errors("collection", method="POST", url=url):
                    async with session.post(url, json=payload) as reply:
                        await raise_boundary_failure(reply, boundary="agent")
                        body = await _bounded_body(reply, self.config.max_reply_bytes, target)
            except aiohttp.ClientError as error:
                # Not a transport failure `map_transport_errors` names: the reply came but could not be
                # read as HTTP (a header line over aiohttp's 8190 bytes, a malformed status line). The
                # error's text quotes the reply's bytes: only its type is kept.
                raise CollectionFailure(
                    failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                    failure_reason=f"{target}: the reply could not be read ({type(error).__name__})",
                    exception_type=exception_type_name(error),
                ) from error
            return episode_response(body, url)
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


def episode_response(body: bytes, url: str) -> BaseEpisodeResponse:
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
    config: CollectionConfig, on_progress: Callable[[CollectionProgress], None] | None = None
) -> CollectionSummary:
    """Run one collection (resuming what is on disk) and return its summary."""
    return await Collector(config, on_progress).run()
