"""Telemetry: OpenTelemetry metrics and span attributes for servers and collections, `/metrics` for
Prometheus, and the running counts of a collection.

Optional (the `otel` extra, `opentelemetry-api`; the core never imports it). Recording goes through
the global OpenTelemetry providers, as the API intends for libraries: configure a meter or tracer
provider and the middleware and the collector report to it, with no gym-failures setup call. Without
the API, or before a provider is set, every record is a no-op; the middleware's success path (a reply
without a report) records nothing at all. Recording never raises into the caller.

What is recorded:

- `gym.rollout.completed_total` (counter, unit `1`), by the collector: one per finished attempt,
  after its row is written, with `nemo.gym.rollout.outcome` (`scored`, `masked`, `tainted`,
  `gate_derived`, `failed`, `omitted`: a success counted as the gate counts it, `rollout_outcome`) and
  `nemo.gym.rollout.dispatch.name` (the collection's `agent_name`); on failures, tainted and
  gate-derived successes also `nemo.gym.failure_class` and `nemo.gym.failure_kind`, on failures
  `nemo.gym.failure_type`.
- `gym.server.failures` (counter, unit `{failure}`), by `FailureReportMiddleware`: one per reply
  that carries a failure, with `nemo.gym.boundary`, `nemo.gym.failure_kind`,
  `nemo.gym.failure_class`, `nemo.gym.stage` and `http.response.status_code`.
- `gym.server.failure_report.size` (histogram, unit `By`, no attributes): the size of each report
  the middleware replies with (its header; for a report over the 4096-byte bound, which is sent cut,
  the whole report's JSON), so operators see how close replies come to the bound and how often they
  pass it. The sizes are kept in process and recorded in batches, at each collection and whenever
  128 wait, outside any trace (no exemplar under the default filter).
- What each of those attempts cost, from its row (`_gf_duration_s`, `_gf_model_calls`, `_gf_usage`;
  nothing for a row that reports none, such as a row NeMo Gym's own collector writes), with the
  counter's attributes but `nemo.gym.failure_type`: `gym.rollout.attempt.duration` (histogram, unit
  `s`: the attempt's wall time at the collector), `gym.rollout.attempt.model_attempts` (histogram,
  unit `{attempt}`: the model attempts of the attempt's logical model calls, SDK and client retries
  included: their mean is the amplification per rollout attempt) and `gym.rollout.attempt.tokens`
  (counter, unit `{token}`, with `gen_ai.token.type` `input` or `output`).
- On the active span (a server's span), a reply with a failure report sets the attributes
  `nemo.gym.failure.chain` (every event of the report, `kind@boundary`) and, when it carries a
  failure, that failure's `nemo.gym.failure.event_id`, `cause_id`, kind, boundary and stage,
  `error.type` (its kind) and the error status. A caller that rebuilds a remote failure adds the
  event `gym.failure.remote` with the remote event ids to its own span: the join of the hops.

Every name here is gym-failures' own: NeMo Gym 0.7.0 records none of these instruments or attributes
(its rollout outcomes are exporter step metrics, `progress/<agent>/failed`, `omitted`, `masked_pct`:
nemo_gym/rollout_collection.py:133). In a NeMo Gym server the instruments share the global meter
provider, and so the resource with NeMo Gym's `nemo.gym.server.name`, `nemo.gym.server.type` and
`nemo.gym.version` (docs/telemetry.md, "NeMo Gym 0.7.0").

The counters are observable counters, counted in process and read at each collection: the SDK's
synchronous `add` with five attributes costs about 5 µs, this about 0.3 µs. The attempts' histograms
are synchronous, one record per attempt: an attempt's own round trip is milliseconds at least.
Labels are bounded (`failure_kind_label`): reasons, ids and URLs are never labels.

Decisions:
- A failure written into a streamed reply's terminal event is not seen by the middleware (streams
  pass through untouched), so it is not counted; the relay that reads it records it on its span only
  when it rebuilds it.
- The collector's `omitted` is an attempt whose row could not be saved (which ends the run); a row
  that closes a rollout on resume without a dispatch is no attempt and is not counted.
"""

from gym_failures.telemetry._labels import (
    MAX_FAILURE_TYPES,
    MAX_NAMESPACED_KINDS,
    failure_kind_label,
    failure_type_label,
)
from gym_failures.telemetry._progress import CollectionProgress, RolloutOutcome, rollout_outcome
from gym_failures.telemetry._prometheus import MetricsServer, MetricsUnavailable, serve_metrics
from gym_failures.telemetry._record import (
    ATTEMPT_DURATION,
    ATTEMPT_MODEL_ATTEMPTS,
    ATTEMPT_TOKENS,
    REPORT_SIZE,
    ROLLOUTS_COMPLETED,
    SERVER_FAILURES,
    SPAN_EVENT,
    SPAN_REMOTE_EVENT,
    record_remote_failure,
    record_reply,
    record_rollout,
)

__all__ = [
    "ATTEMPT_DURATION",
    "ATTEMPT_MODEL_ATTEMPTS",
    "ATTEMPT_TOKENS",
    "MAX_FAILURE_TYPES",
    "MAX_NAMESPACED_KINDS",
    "REPORT_SIZE",
    "ROLLOUTS_COMPLETED",
    "SERVER_FAILURES",
    "SPAN_EVENT",
    "SPAN_REMOTE_EVENT",
    "CollectionProgress",
    "MetricsServer",
    "MetricsUnavailable",
    "RolloutOutcome",
    "failure_kind_label",
    "failure_type_label",
    "record_remote_failure",
    "record_reply",
    "record_rollout",
    "rollout_outcome",
    "serve_metrics",
]
