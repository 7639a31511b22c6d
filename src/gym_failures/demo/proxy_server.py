"""The demo's chaos proxy: a `gym_failures.proxy.ChaosProxy` in front of the resources server, so the
demo's failures also come from a hop that is not the model.

Run by the launcher as `python -m gym_failures.demo.proxy_server --config ... --fd ... --parent-pid ...`,
like the other servers; the agent calls the resources server through it (`DemoConfig.proxy_url`).
Every path is forwarded (`/seed_session`, `/sandbox/run`, `/verify`, `/health`) with the caller's
token, which the resources server checks; the proxy's control routes (`/_gym/...`) need the run's
token as every demo endpoint does (`DemoGuard`).

Its faults (the plan's `proxy` section, `gym_failures.demo._plan.ProxyFaults`) strike `POST /verify`
only, as the proxy's `status` fault: a 503 the proxy answers itself, never forwarded, with a failure
report of the resources server's boundary whose reason starts "[proxy] injected":

- `unavailable`: Retry-After `UNAVAILABLE_RETRY_AFTER_S`. The agent waits and tries again
  (`gym_failures.demo._resources_calls`); the attempt's row keeps the event among what it recovered
  from.
- `outage`: Retry-After `OUTAGE_RETRY_AFTER_S`, past the agent's budget for the call
  (`RESOURCES_BUDGET_S`). The agent gives up at once: the attempt fails, its cause chain ending at
  the proxy's event, and the collector's next attempt draws again.

Decisions:
- The plan is a real `ProxyPlan` (`proxy_plan`), but the proxy's own draws are not used: they come
  from one seeded sequence in arrival order, so which rollout got a fault would depend on timing.
  Each request's number is drawn from its identity instead (the headers the agent sends: rollout id,
  attempt, try), as every demo fault is (`gym_failures.demo._plan.draw`), mapped onto the plan by
  `ProxyPlan.pick`, and forced with the proxy's own header (`X-Gym-Fault`; `none` when nothing is
  drawn, so the proxy never draws by itself; a caller's own header is dropped). The same seed injects
  the same faults into the same rollouts, whatever the timing.
- The ground truth: every reply the proxy marks as injected (`X-Gym-Fault-Event`) is written to
  `proxy.injected.jsonl` as its head is sent (`FaultRecorder`), with the event id the agent's row
  holds; the launcher merges it with the other servers' into `injected_faults.jsonl`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_failures.demo._plan import FaultRecorder, ProxyFaults, draw
from gym_failures.demo._serve import (
    ATTEMPT_HEADER,
    ROLLOUT_HEADER,
    TRY_HEADER,
    DemoConfig,
    DemoGuard,
    main,
)
from gym_failures.failure_records import FailureBoundary
from gym_failures.proxy import ChaosProxy, PlannedFault, ProxyPlan

__all__ = ["OUTAGE_RETRY_AFTER_S", "ROUTE", "UNAVAILABLE_RETRY_AFTER_S", "create_app", "proxy_plan"]

ROUTE = "/verify"
"""The one route the demo's proxy faults strike."""
UNAVAILABLE_RETRY_AFTER_S = 0.25
"""The Retry-After of an `unavailable` 503: well within the agent's budget for the call."""
OUTAGE_RETRY_AFTER_S = 60.0
"""The Retry-After of an `outage` 503: past the agent's budget for the call (`RESOURCES_BUDGET_S`)."""
_RETRY_AFTER_S = {"unavailable": UNAVAILABLE_RETRY_AFTER_S, "outage": OUTAGE_RETRY_AFTER_S}

_FAULT_HEADER = b"x-gym-fault"
_EVENT_HEADER = b"x-gym-fault-event"


def proxy_plan(faults: ProxyFaults, seed: int) -> tuple[ProxyPlan, tuple[str, ...]]:
    """The `ChaosProxy` plan of the demo's `proxy` faults, and the demo's name of each of its planned
    faults, in the plan's order."""
    names = tuple(type(faults).model_fields)
    planned = [
        PlannedFault(
            fault="status",
            rate=getattr(faults, name),
            route=ROUTE,
            method="POST",
            params={"code": 503, "retry_after": _RETRY_AFTER_S[name]},
        )
        for name in names
    ]
    return ProxyPlan(faults=planned, seed=seed), names


@dataclass(frozen=True)
class _Identity:
    """Who sends a request, from the agent's identity headers."""

    rollout_id: str
    attempt: int
    try_number: int

    @classmethod
    def of(cls, headers: Sequence[tuple[bytes, bytes]]) -> _Identity | None:
        """The identity in `headers`; `None` without a rollout id (the launcher's `/health`)."""
        values = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}
        rollout_id = values.get(ROLLOUT_HEADER.lower(), "")
        if not rollout_id:
            return None
        return cls(rollout_id, _int(values.get(ATTEMPT_HEADER.lower())), _int(values.get(TRY_HEADER.lower())))


def _int(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() and len(value) < 10 else 0


class KeyedFaults:
    """ASGI middleware in front of the proxy's app: each request's fault drawn from its identity and
    forced with `X-Gym-Fault`, every injected one recorded (the module's docstring)."""

    def __init__(
        self, app: ASGIApp, *, plan: ProxyPlan, names: Sequence[str], seed: int, recorder: FaultRecorder
    ) -> None:
        self.app = app
        self.plan = plan
        self.names = tuple(names)
        self.seed = seed
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing(send))
            return
        if scope["type"] != "http" or scope["path"].startswith("/_gym/"):
            await self.app(scope, receive, send)
            return
        who = _Identity.of(scope["headers"])
        name, header = self._draw(scope["method"], scope["path"], who)
        headers = [(key, value) for key, value in scope["headers"] if key != _FAULT_HEADER]
        scope = {**scope, "headers": [*headers, (_FAULT_HEADER, header.encode())]}
        if name is None or who is None:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, self._recording(send, name, who, scope["path"]))

    def _draw(self, method: str, path: str, who: _Identity | None) -> tuple[str | None, str]:
        """The demo's name of the fault this request gets and the header that forces it on the proxy;
        `(None, "none")` for no fault."""
        if who is None:
            return None, "none"
        u = draw(self.seed, "proxy", who.rollout_id, who.attempt, path, who.try_number)
        planned = self.plan.pick(u, method, path, None)
        if planned is None:
            return None, "none"
        index = next(i for i, fault in enumerate(self.plan.faults) if fault is planned)
        params = "".join(f"; {key}={_number(value)}" for key, value in planned.params.items())
        return self.names[index], planned.fault + params

    def _recording(self, send: Send, name: str, who: _Identity, route: str) -> Send:
        """`send`, recording the fault `name` when the reply's head says the proxy injected it."""

        async def send_recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                event_id = headers.get(_EVENT_HEADER)
                if event_id:
                    self.recorder.record(
                        f"proxy.{name}",
                        who.rollout_id,
                        who.attempt,
                        event_id=event_id.decode("latin-1"),
                        route=route,
                        status=message["status"],
                        retry_after_s=_RETRY_AFTER_S[name],
                        call=route.lstrip("/"),
                        **{"try": who.try_number},
                    )
            await send(message)

        return send_recorded

    def _closing(self, send: Send) -> Send:
        async def send_closing(message: Message) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self.recorder.close()
            await send(message)

        return send_closing


def _number(value: float | str) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def create_app(config: DemoConfig, token: str) -> ASGIApp:
    """The proxy's ASGI app, in front of `config.resources_url`; every request must carry the run's
    `token` (`DemoGuard`), which the resources server checks again on every forwarded one."""
    plan, names = proxy_plan(config.plan.proxy, config.seed)
    proxy = ChaosProxy(upstream=config.resources_url, plan=plan, boundary=FailureBoundary.RESOURCES_SERVER)
    recorder = FaultRecorder(config.run_dir, "proxy")
    keyed = KeyedFaults(proxy.app(), plan=plan, names=names, seed=config.seed, recorder=recorder)
    return DemoGuard(keyed, token=token)


if __name__ == "__main__":
    main("proxy", create_app)
