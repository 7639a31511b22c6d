"""The classification configuration models: pydantic, apart so that default classification needs none.

`FailureClassificationConfig` and `StageClassificationConfig` are documented, and reached, as
`gym_failures.failure_kinds.FailureClassificationConfig` and `...StageClassificationConfig`:
`failure_kinds` loads this module the first time either is asked for (PEP 562). A reader that only
classifies with the defaults (`gym-failures gate`, the summary) reads `gym_failures._classification`'s
plain tables and never defines a pydantic model, which would cost it pydantic's model machinery at
every start (docs/benchmarks.md, "Command-line start-up").

The models are built on `gym_failures._classification`'s public tables; that module never imports
this one back (it names the models for type checking only).
"""

# No `from __future__ import annotations`: the fields' annotations are evaluated here, so pydantic
# never has to resolve a name in this module's namespace later (the defaults are built deferred).

from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gym_failures._classification import (
    DEFAULT_CLASSIFICATION,
    FOREIGN_CLASSIFICATION,
    STAGE_DEFAULT_CLASSES,
    FailureClass,
    default_reporting_kinds,
    is_classifiable,
    validate_classification_kinds,
)
from gym_failures._vocabulary import FailureStage

StatusCode = Annotated[int, Field(ge=400, le=599)]


class StageClassificationConfig(BaseModel):
    """Classification overrides for an established originating stage."""

    # Built on first validation, not at import: the defaults are made with `model_construct` (see
    # `stage_defaults`), so a caller that only reads them builds no validator.
    model_config = ConfigDict(extra="forbid", defer_build=True)

    by_failure_kind: dict[str, FailureClass] = Field(default_factory=dict)
    default_class: FailureClass | None = None

    @field_validator("by_failure_kind")
    @classmethod
    def validate_kinds(cls, value: dict[str, FailureClass]) -> dict[str, FailureClass]:
        return validate_classification_kinds(value)


def stage_defaults() -> dict[FailureStage, StageClassificationConfig]:
    """The default rules of each stage (`_classification.STAGE_DEFAULT_CLASSES`), as models.

    `model_construct` with valid values is what validation returns (same values, same fields set)
    without building the validator; tests/test_failure_kinds.py checks it.
    """
    return {
        stage: (
            StageClassificationConfig.model_construct()
            if default_class is None
            else StageClassificationConfig.model_construct(default_class=default_class)
        )
        for stage, default_class in STAGE_DEFAULT_CLASSES.items()
    }


class FailureClassificationConfig(BaseModel):
    """One shared stage/kind mapping and explicit HTTP evidence rules.

    Class overrides by HTTP status take precedence, followed by stage kind/default, HTTP-derived
    evidence, kind, and the unknown fallback. Stage rules require context admitted by the caller; a
    provider cannot establish agent ownership on its own. Partial overrides retain unspecified
    defaults. HTTP-derived labels are reporting projections only: never write them back into
    observed failure events.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)  # see StageClassificationConfig

    by_failure_kind: dict[str, FailureClass] = Field(
        default_factory=lambda: {
            **{kind: cls for kind, (cls, _) in DEFAULT_CLASSIFICATION.items()},
            **FOREIGN_CLASSIFICATION,
        }
    )
    by_stage: dict[FailureStage, StageClassificationConfig] = Field(default_factory=stage_defaults)
    by_status_code: dict[StatusCode, FailureClass] = Field(default_factory=dict)
    default_class: FailureClass = FailureClass.UNKNOWN
    reporting_kind_by_status_code: dict[StatusCode, str | None] = Field(
        default_factory=lambda: default_reporting_kinds(policy=True)
    )
    non_policy_reporting_kind_by_status_code: dict[StatusCode, str | None] = Field(
        default_factory=lambda: default_reporting_kinds(policy=False)
    )

    @field_validator(
        "by_failure_kind",
        "reporting_kind_by_status_code",
        "non_policy_reporting_kind_by_status_code",
        mode="before",
    )
    @classmethod
    def merge_rules(cls, value: dict[Any, Any], info: ValidationInfo) -> dict[Any, Any]:
        if not isinstance(value, Mapping):
            return value  # let validation report the wrong type
        field = cls.model_fields[info.field_name or ""]
        defaults = field.get_default(call_default_factory=True)
        return {**defaults, **value}

    @field_validator("by_stage", mode="before")
    @classmethod
    def merge_stages(cls, value: object) -> object:
        defaults: dict[str, BaseModel] = {stage: rules for stage, rules in stage_defaults().items()}
        return merge_stage_overrides(defaults, value, dict_fields=("by_failure_kind",))

    @field_validator("by_failure_kind")
    @classmethod
    def validate_kinds(cls, value: dict[str, FailureClass]) -> dict[str, FailureClass]:
        return validate_classification_kinds(value)

    @field_validator("reporting_kind_by_status_code", "non_policy_reporting_kind_by_status_code")
    @classmethod
    def validate_reporting_kinds(cls, value: dict[int, str | None]) -> dict[int, str | None]:
        for status, kind in value.items():
            if kind is not None and not is_classifiable(kind):
                raise ValueError(f"status {status}: {kind[:200]!r} is not a failure kind")
        return value


def merge_stage_overrides(
    defaults: dict[str, BaseModel], value: object, dict_fields: tuple[str, ...]
) -> object:
    """Merge partial stage configurations before their concrete models validate them."""
    if not isinstance(value, Mapping):
        return value  # let validation report the wrong type
    merged: dict[object, object] = {
        stage: config.model_dump(exclude_unset=False) for stage, config in defaults.items()
    }
    for stage, override in value.items():
        base = merged.get(stage)
        if isinstance(override, BaseModel):
            override = override.model_dump(exclude_unset=True)
        if not isinstance(base, dict) or not isinstance(override, Mapping):
            merged[stage] = override
            continue
        combined = dict(base)
        for key, item in override.items():
            if key in dict_fields and isinstance(item, Mapping) and isinstance(base.get(key), dict):
                combined[key] = {**base[key], **item}
            else:
                combined[key] = item
        merged[stage] = combined
    return merged


@cache
def default_classification_config() -> FailureClassificationConfig:
    """Private read-only default for classification; caller-created configs remain independent.

    Without input, validation only fills the defaults (no default is validated, no validator runs on
    one), which is what `model_construct()` does without building the validator. Classification itself
    reads `_classification.DEFAULT_RULES`, the same values as plain data.
    """
    default: FailureClassificationConfig = FailureClassificationConfig.model_construct()
    return default
