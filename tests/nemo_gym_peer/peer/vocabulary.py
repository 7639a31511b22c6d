"""NeMo Gym 0.7.0's failure vocabulary as its own module defines it: kinds, constants, stages.

Argument: a JSON list of labels; the result says which of them NeMo Gym's own boundary check
(`validate_failure_kind`, which warns once per unknown name and never raises) warns about.
"""

import json
import logging
import sys
import typing

import nemo_gym.failure_kinds as kinds
from _peer import report

warnings: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        warnings.append(record.getMessage())


kinds.logger.addHandler(_Collect())
unknown = []
for label in json.loads(sys.argv[1]):
    warnings.clear()
    kinds.validate_failure_kind(label)
    if warnings:
        unknown.append(label)

report(
    {
        "kinds": sorted(kinds.FAILURE_KINDS),
        "constants": {
            name: value
            for name, value in vars(kinds).items()
            if name.isupper() and not name.startswith("_") and isinstance(value, str)
        },
        "stages": list(typing.get_args(kinds.FailureStage)),
        "warned": unknown,
    }
)
