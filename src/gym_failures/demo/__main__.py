"""`python -m gym_failures.demo`: run the demo gym and print where its files are."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from gym_failures.collection import read_rows
from gym_failures.demo._options import DemoOptions, DemoOptionsError
from gym_failures.demo.launcher import run_demo
from gym_failures.telemetry import CollectionProgress


def _progress(progress: CollectionProgress) -> None:
    if sys.stderr.isatty():
        done, total = progress.done, progress.expected
        print(f"\rcollected {done}/{total} rollouts", end="" if done < total else "\n", file=sys.stderr)


_TYPES: dict[str, Callable[[str], object]] = {
    "out_dir": Path,
    "rollouts": int,
    "concurrency": int,
    "fault_plan": Path,
    "seed": int,
    "policy_timeout_s": float,
}
"""How each flag's text becomes its field's type; the rest stay text. Bounds and rules are checked by
`DemoOptions` alone."""

_ENVIRONMENT = {"policy_base_url": "GYM_DEMO_MODEL_BASE_URL", "policy_model": "GYM_DEMO_MODEL_NAME"}
"""The variables that stand in for a flag not given."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gym_failures.demo",
        description="Run the local demo gym with fault injection and collect its rollouts. The API key "
        "of an external model comes from $GYM_DEMO_MODEL_API_KEY or $OPENAI_API_KEY, never a flag.",
    )
    for field, flag in DemoOptions.FLAGS.items():
        info = DemoOptions.model_fields[field]
        variable = _ENVIRONMENT.get(field)
        where = f"${variable}, else {info.default}" if variable else str(info.default)
        parser.add_argument(
            flag,
            dest=field,
            metavar=flag.removeprefix("--").upper().replace("-", "_"),
            type=_TYPES.get(field, str),
            # Absent stays absent, so every default is `DemoOptions`' own.
            default=os.environ.get(variable, argparse.SUPPRESS) if variable else argparse.SUPPRESS,
            help=f"{info.description} (default: {where})",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    arguments = vars(parser.parse_args(argv))
    try:
        run_dir = run_demo(**arguments, on_progress=_progress)
    except DemoOptionsError as error:
        parser.error(str(error))  # one line, naming the flag; never the URL's secret
    except KeyboardInterrupt:
        # run_demo has stopped the servers by now; the rows saved so far stay, and a rerun resumes
        # nothing (each run has its own directory), so say where they are rather than a traceback.
        out_dir = arguments.get("out_dir", DemoOptions.model_fields["out_dir"].default)
        print(f"\ninterrupted; the servers are stopped. Partial runs are under {out_dir}/", file=sys.stderr)
        return 130
    demo = json.loads((run_dir / "demo.json").read_text())
    collection = demo["collection"]
    final_kinds = Counter(
        str(row.get("failure", {}).get("failure_kind"))
        for row in read_rows(run_dir / "rollouts_failures.jsonl")
        if row.get("final") is True
    )
    print(
        f"Collected {collection['expected']} rollouts in {demo['elapsed_s']:.1f} s: "
        f"{collection['succeeded']} succeeded, {collection['failed_final']} failed "
        f"({collection['attempts']} attempts)."
    )
    if final_kinds:
        print("Final failures: " + ", ".join(f"{kind} {n}" for kind, n in final_kinds.most_common()))
    print("Injected faults: " + ", ".join(f"{fault} {n}" for fault, n in demo["injected_faults"].items()))
    print(f"\nRun directory: {run_dir}")
    for name, what in (
        ("tasks.jsonl", "the tasks"),
        ("rollouts.jsonl", "success rows: reward, response, verification, recovered failures"),
        ("rollouts_failures.jsonl", "one row per failed attempt, with its failure report"),
        ("rollouts.manifest.json", "the collection's manifest"),
        ("injected_faults.jsonl", "every fault the servers injected"),
        ("model.log, resources.log, agent.log", "each server's log"),
        ("demo.json", "this summary"),
    ):
        print(f"  {name:<38} {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
