"""The demo's options: every setting of a run, its default, and the one check each gets.

`run_demo` validates its arguments here before it writes anything; `gym-failures demo` (which
`python -m gym_failures.demo` runs too) only turns its flags into these fields. A refused value is a
`DemoOptionsError` whose message is one line and names the option by its command-line flag
(`DemoOptions.FLAGS`), the form the command line shows its users.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from gym_failures.demo._plan import FaultPlan, ProxyFaults, load_fault_plan
from gym_failures.demo._serve import check_policy_base_url

__all__ = ["EXTERNAL_POLICY_TIMEOUT_S", "DemoOptions", "DemoOptionsError"]

EXTERNAL_POLICY_TIMEOUT_S = 60.0
"""The policy timeout with an external model and no `policy_timeout_s`: a real model generates for
seconds, not the scripted policy's milliseconds."""


class DemoOptionsError(ValueError):
    """A demo option that cannot be run with: `option` names it as its command-line flag (`None` when
    the fault is in how several combine), `reason` says what is wrong. The message never repeats a
    model base URL, which may hold a secret."""

    def __init__(self, reason: str, option: str | None = None) -> None:
        super().__init__(reason, option)
        self.reason = reason
        self.option = option

    def __str__(self) -> str:
        return self.reason if self.option is None else f"{self.option}: {self.reason}"

    @classmethod
    def of(cls, error: ValidationError) -> DemoOptionsError:
        """The first error of `error` as one line; pydantic's own text spans several."""
        first = error.errors(include_url=False, include_input=False)[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, DemoOptionsError):
            return cause  # a model validator's, which names its option itself
        field = str(first["loc"][0]) if first["loc"] else None
        return cls(_reason(first), None if field is None else DemoOptions.FLAGS.get(field, field))


def _reason(error: Any) -> str:
    # A ValueError raised by a validator reads better without pydantic's "Value error, " prefix.
    cause = (error.get("ctx") or {}).get("error")
    return str(cause) if error["type"] == "value_error" and cause is not None else str(error["msg"])


class DemoOptions(BaseModel):
    """One demo run's options, each with its default; see `run_demo` for what they do.

    `DemoOptions(**values)` raises `DemoOptionsError` (a `ValueError`) for a value it refuses.
    """

    # A refused policy_base_url may hold a secret: never repeat the input in an error.
    model_config = ConfigDict(
        extra="forbid", frozen=True, hide_input_in_errors=True, use_attribute_docstrings=True
    )

    FLAGS: ClassVar[dict[str, str]] = {
        "out_dir": "--out",
        "rollouts": "--rollouts",
        "num_repeats": "--num-repeats",
        "concurrency": "--concurrency",
        "fault_plan": "--fault-plan",
        "seed": "--seed",
        "policy_base_url": "--model-base-url",
        "policy_model": "--model-name",
        "stream": "--stream",
        "policy_timeout_s": "--policy-timeout",
        "proxy": "--no-proxy",
    }
    """Each field's command-line flag; a field without one (`max_attempts`) is named as itself."""

    out_dir: Path = Path("runs")
    """The parent of the run directory (`<out_dir>/<UTC timestamp>/`)."""
    rollouts: int = Field(default=200, ge=1)
    """Arithmetic tasks to collect, `num_repeats` rollouts each."""
    num_repeats: int = Field(default=1, ge=1, le=1000)
    """Rollouts of each task (NeMo Gym's `num_repeats`): a prompt group of that many members."""
    concurrency: int = Field(default=16, ge=1)
    """Rollouts in flight at once."""
    fault_plan: Path | None = None
    """A fault plan JSON file; `None` for the packaged default (`DEFAULT_FAULT_PLAN`)."""
    seed: int = 0
    """Seeds the tasks, the scripted policy and every fault draw."""
    policy_base_url: str | None = None
    """An OpenAI-compatible base URL that serves the policy instead of the scripted one; refused with
    user info, a query string or a fragment (`check_policy_base_url`). Needs `policy_model`."""
    policy_model: str | None = None
    """The external policy's model name. Needs `policy_base_url`."""
    stream: Literal["auto", "always", "never"] = "auto"
    """Whether the agent streams policy calls; `auto` streams about half of the rollouts."""
    policy_timeout_s: float | None = Field(default=None, gt=0)
    """Seconds one policy call may take; `None` keeps the plan's, or `EXTERNAL_POLICY_TIMEOUT_S` with
    an external policy."""
    max_attempts: int = Field(default=3, ge=1)
    """The collector's attempts per rollout."""
    proxy: bool = True
    """Whether the agent calls the resources server through the chaos proxy
    (`gym_failures.demo.proxy_server`); without it the plan's `proxy` faults are not injected."""

    _plan: FaultPlan = PrivateAttr()

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            # Translated once, here, so no caller shows its users pydantic's multi-line dump.
            raise DemoOptionsError.of(error) from error

    @field_validator("policy_base_url")
    @classmethod
    def _no_secret_in_the_url(cls, url: str | None) -> str | None:
        return None if url is None else check_policy_base_url(url)

    @model_validator(mode="before")
    @classmethod
    def _external_policy_timeout(cls, values: Any) -> Any:
        if (
            isinstance(values, dict)
            and values.get("policy_timeout_s") is None
            and values.get("policy_base_url") is not None
        ):
            return {**values, "policy_timeout_s": EXTERNAL_POLICY_TIMEOUT_S}
        return values

    @model_validator(mode="after")
    def _complete_and_loadable(self) -> Self:
        if (self.policy_base_url is None) != (self.policy_model is None):
            raise ValueError("an external policy needs both --model-base-url and --model-name")
        # Loaded now, so a plan that cannot be read is refused before the run writes anything.
        flag = self.FLAGS["fault_plan"]
        try:
            plan = load_fault_plan(self.fault_plan)
        except OSError as error:
            raise DemoOptionsError(f"cannot read {self.fault_plan}: {error.strerror}", flag) from error
        except ValidationError as error:
            reason = f"{self.fault_plan} is not a fault plan: {_plan_error(error)}"
            raise DemoOptionsError(reason, flag) from error
        if self.policy_timeout_s is not None:
            plan = plan.with_policy_timeout(self.policy_timeout_s)
        if not self.proxy:
            plan = plan.model_copy(update={"proxy": ProxyFaults()})  # what the run injects, no more
        self._plan = plan
        return self

    @property
    def plan(self) -> FaultPlan:
        """The fault plan the run injects: `fault_plan`'s (or the packaged one), with `policy_timeout_s`
        in place of its own when given, and no `proxy` faults without the proxy."""
        return self._plan

    @property
    def external_policy(self) -> bool:
        """Whether an external endpoint serves the policy."""
        return self.policy_base_url is not None


def _plan_error(error: ValidationError) -> str:
    """The first error of a fault plan as `section.field: reason`."""
    first = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {_reason(first)}" if where else _reason(first)
