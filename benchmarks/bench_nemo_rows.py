"""Reading rows through `rows.normalized`: the cost of NeMo Gym's forms against the copy every read makes.

Reading NeMo Gym's keys adds a handful of lookups for a row of ours and, for a flat NeMo Gym completed
row, the building of its `result`. The baseline is `normalized` as it was before (`_before`, copied
here), measured in the same rounds; a parse of the row's JSON (`json.loads`), which every reader pays
first, is shown beside it for scale.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks._timing import compare, markdown_table, ratio_row
from gym_failures.rows import normalized

_RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "status": "completed",
    "output": [{"type": "message", "content": [{"type": "output_text", "text": "The answer is 42."}]}],
}

ROWS: dict[str, dict[str, Any]] = {
    "gym-failures success row": {
        "task_index": 3,
        "rollout_index": 0,
        "rollout_id": "3:0",
        "attempt": 1,
        "_ng_task_index": 3,
        "_ng_rollout_index": 0,
        "result": {"reward": 1.0, "verification": {"verdict": True}},
        "reward": 1.0,
        "response": _RESPONSE,
    },
    "NeMo Gym completed row": {
        "_ng_task_index": 3,
        "_ng_rollout_index": 0,
        "reward": 1.0,
        "response": _RESPONSE,
        "agent_ref": {"name": "simple_agent"},
    },
    "NeMo Gym failure row": {
        "_ng_task_index": 3,
        "_ng_rollout_index": 0,
        "_ng_attempt_index": 1,
        "_ng_failure_class": "agent_request_failed",
        "_ng_failure_terminal": False,
        "_ng_failure_message": "POST /run answered 502",
        "_ng_failure_type": "ClientResponseError",
        "_ng_failure_http_status": 502,
    },
}


def _before(row: Mapping[str, Any]) -> dict[str, Any]:
    """`normalized` as it was before it read NeMo Gym's forms (it knew only `_ng_failure_class`)."""
    result = dict(row)
    if "failure" not in result and "_ng_failure_class" in result:
        terminal = result.get("_ng_failure_terminal") is True
        result["failure"] = {"failure_kind": result.get("_ng_failure_class"), "terminal": terminal}
        result.setdefault("final", terminal)
        result.setdefault("attempt", 1)
    if "rollout_id" not in result:
        task_index, rollout_index = result.get("task_index"), result.get("rollout_index", 0)
        if type(task_index) is int and type(rollout_index) is int:
            result["rollout_id"] = f"{task_index}:{rollout_index}"
    return result


def _figures(row: dict[str, Any]) -> dict[str, float]:
    text = json.dumps(row)
    subjects: dict[str, Callable[[], object]] = {
        "normalized": lambda: normalized(row, 3),
        "before": lambda: _before(row),
        "json.loads": lambda: json.loads(text),
    }
    return compare(subjects)


def main() -> str:
    rows = []
    for name, row in ROWS.items():
        figures = _figures(row)
        rows.append(ratio_row(f"{name}: normalized vs before", figures["normalized"], figures["before"]))
        rows.append(
            ratio_row(f"{name}: normalized vs json.loads", figures["normalized"], figures["json.loads"])
        )
    return markdown_table(("subject", "µs per call", "baseline µs", "ratio", "target"), rows)


if __name__ == "__main__":
    print(main())
