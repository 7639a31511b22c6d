"""The collector: dispatch rollouts to an agent server, save each attempt's outcome and failure report.

Protocol with the agent server: `POST <agent_url>/run` with the JSON body
`{"task": <input row>, "rollout_id": "<task>:<rollout>", "attempt": <n>}`; the reply is a
`BaseEpisodeResponse` (exactly one of `result` or `failure`, and `failure_report`), with the
`X-NG-Failure-Report` header. A non-2xx reply is the agent's failure (rebuilt with
`raise_boundary_failure`); a reply that never arrives is the collector's own failure, of boundary
`collection` and a transport kind, with the transport error as its cause.

Retries: a failure with `terminal=True` is final at once; any other is retried until the rollout has
used `max_attempts` attempts, and the last failure row then says `attempt_budget_exhausted`.

Resume: both output files are read; a rollout with a success row or a final failure row is done, and
any other continues at its next attempt number. `<output>.manifest.json` holds the digest of the input
file and of `num_repeats`; resuming against a different input or `num_repeats` is refused with
`collection_resume_refused` unless `force_resume` is set. `max_attempts`, the concurrency and the agent
URL may change between runs; no endpoint or credential is written to the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym_failures.client import map_transport_errors, raise_boundary_failure
from gym_failures.collection._rows import (
    JsonlScan,
    RowWriter,
    read_rows,
    repair_torn_tail,
    rollout_id,
)
from gym_failures.failure_kinds import COLLECTION_RESUME_REFUSED, ENVIRONMENT_PROTOCOL_VIOLATION
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, FailureReport
from gym_failures.failure_transport import FailureReportRow, RequestFailureLog
from gym_failures.failures import CollectionFailure, NgFailureEvent

MANIFEST_VERSION = 1


class CollectionConfig(BaseModel):
    """What one collection run does."""

    model_config = ConfigDict(extra="forbid")

    input_path: Path
    output_path: Path
    """`<output>.jsonl`; failures go to `<output>_failures.jsonl` beside it."""
    agent_url: str
    num_repeats: int = Field(default=1, ge=1)
    concurrency: int = Field(default=16, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    force_resume: bool = False

    @property
    def failures_path(self) -> Path:
        return self.output_path.with_name(f"{self.output_path.stem}_failures.jsonl")

    @property
    def manifest_path(self) -> Path:
        return self.output_path.with_name(f"{self.output_path.stem}.manifest.json")


@dataclass
class CollectionSummary:
    """What a run did, and what it found on disk when it started."""

    expected: int = 0
    already_done: int = 0
    succeeded: int = 0
    failed_final: int = 0
    attempts: int = 0
    torn_lines: int = 0
    invalid_lines: int = 0
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


def _manifest(config: CollectionConfig) -> dict[str, Any]:
    return {
        "version": MANIFEST_VERSION,
        "input_sha256": _digest(config.input_path),
        "num_repeats": config.num_repeats,
    }


def _check_manifest(config: CollectionConfig) -> None:
    wanted = _manifest(config)
    path = config.manifest_path
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except ValueError:
            found = None
        if found != wanted and not config.force_resume:
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"{config.output_path} was collected from a different input or num_repeats "
                    "(manifest differs); use a new output path, or force the resume"
                ),
            )
    elif (config.output_path.exists() or config.failures_path.exists()) and not config.force_resume:
        raise CollectionFailure(
            failure_kind=COLLECTION_RESUME_REFUSED,
            failure_reason=f"{config.output_path} exists without a manifest; force the resume",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted, indent=2) + "\n")


def _read_tasks(path: Path) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    for row in read_rows(path):
        tasks.append(row)
    return tasks


def _pending(config: CollectionConfig, summary: CollectionSummary) -> list[_Rollout]:
    """Every rollout without a final outcome, at its next attempt number."""
    done: set[str] = set()
    attempts: dict[str, int] = {}
    for path in (config.output_path, config.failures_path):
        torn = repair_torn_tail(path)
        summary.torn_lines += torn is not None
        scan = JsonlScan(path)
        for row in read_rows(path, scan):
            key = row.get("rollout_id")
            if not isinstance(key, str):
                continue
            attempt = row.get("attempt")
            if isinstance(attempt, int):
                attempts[key] = max(attempts.get(key, 0), attempt)
            if "failure" not in row or row.get("final") is True:
                done.add(key)
        summary.invalid_lines += len(scan.invalid_lines)
        summary.scans.append(scan)
    rollouts: list[_Rollout] = []
    for task_index, task in enumerate(_read_tasks(config.input_path)):
        for rollout_index in range(config.num_repeats):
            key = rollout_id(task_index, rollout_index)
            summary.expected += 1
            if key in done:
                summary.already_done += 1
                continue
            rollouts.append(_Rollout(task_index, rollout_index, task, attempts.get(key, 0) + 1))
    return rollouts


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
        self, config: CollectionConfig, on_progress: Callable[[int, int], None] | None = None
    ) -> None:
        self.config = config
        self.on_progress = on_progress
        self.summary = CollectionSummary()
        self._finished = 0

    async def run(self) -> CollectionSummary:
        config = self.config
        _check_manifest(config)
        rollouts = _pending(config, self.summary)
        self._finished = self.summary.already_done
        self._progress()
        queue: asyncio.Queue[_Rollout] = asyncio.Queue()
        for rollout in rollouts:
            queue.put_nowait(rollout)
        timeout = aiohttp.ClientTimeout(total=config.timeout_s)
        connector = aiohttp.TCPConnector(limit=config.concurrency)
        with RowWriter(config.output_path) as successes, RowWriter(config.failures_path) as failures:
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
        return self.summary

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self._finished, self.summary.expected)

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
            self._finished += 1
            self._progress()

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
                successes.write(row)
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
            failures.write(row)
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
                with map_transport_errors("collection", method="POST", url=url):
                    async with session.post(url, json=payload) as reply:
                        await raise_boundary_failure(reply, boundary="agent")
                        body = await reply.read()
                response = _episode_response(body, url)
            except NgFailureEvent as failure:
                return (
                    BaseEpisodeResponse(failure=_episode_failure(failure)),
                    log.reply_report(failure),
                )
            # The reply's body report and its header report describe the same attempt: merge them.
            report = response.failure_report or FailureReport()
            return response, report.merged(log.report)


def _episode_response(body: bytes, url: str) -> BaseEpisodeResponse:
    try:
        return BaseEpisodeResponse.model_validate_json(body)
    except ValidationError as error:
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=(
                f"{url} replied 2xx without a valid episode response "
                f"({error.error_count()} validation error(s))"
            ),
        ) from None


async def collect(
    config: CollectionConfig, on_progress: Callable[[int, int], None] | None = None
) -> CollectionSummary:
    """Run one collection (resuming what is on disk) and return its summary."""
    return await Collector(config, on_progress).run()
