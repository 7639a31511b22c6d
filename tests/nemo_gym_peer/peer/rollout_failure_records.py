"""NeMo Gym 0.7.0's own `RolloutFailure` model on records both ways (run in NeMo Gym's venv only).

    rollout_failure_records.py INPUT_JSON

INPUT_JSON holds `{"validate": [record, ...]}`: each is validated with NeMo Gym's
`RolloutFailure.model_validate` (nemo_gym/rollout_outcomes.py:14) and reported as
`{"ok": true, "dump": ...}` or `{"ok": false, "error": ...}`. NeMo Gym's own records, built here with
its models over every source, delivery and optional field, are reported as `"theirs"`, each as its
`model_dump_json()` reads back as JSON.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

from _peer import report
from nemo_gym.episode_types import EpisodeFailure, EpisodeId
from nemo_gym.rollout_outcomes import RolloutFailure
from pydantic import ValidationError


def _validate(record: Any) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NeMo Gym warns of a kind outside its vocabulary, and keeps it
            validated = RolloutFailure.model_validate(record)
    except ValidationError as error:
        return {"ok": False, "error": str(error).splitlines()[0]}
    return {"ok": True, "dump": json.loads(validated.model_dump_json())}


def _theirs() -> list[dict[str, Any]]:
    records = []
    for index, (source, delivery) in enumerate(
        [
            ("environment", "delivered"),
            ("collector", "not_sent"),
            ("collector", "possibly_delivered"),
            ("collector", "delivered"),
        ]
    ):
        failure = EpisodeFailure(
            failure_reason=f"attempt failed ({index})",
            terminal=index % 2 == 0,
            failure_kind="model_context_overflow" if index % 2 else None,
            stage="agent" if index == 1 else None,
        )
        records.append(
            RolloutFailure(
                episode_id=EpisodeId(rollout_id=["3-1", "task_a.7", "0-0", "12-4"][index], attempt=index),
                run_id=f"run-{index}",
                source=source,
                delivery=delivery,
                failure=failure,
                http_status=502 if index == 0 else None,
                exception_type="aiohttp.ServerTimeoutError" if index == 2 else None,
            )
        )
    return [json.loads(record.model_dump_json()) for record in records]


def main() -> None:
    with open(sys.argv[1]) as handle:
        given = json.load(handle)
    report({"validated": [_validate(record) for record in given["validate"]], "theirs": _theirs()})


if __name__ == "__main__":
    main()
