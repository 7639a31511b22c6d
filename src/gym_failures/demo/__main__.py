"""`python -m gym_failures.demo`: run the demo gym and print where its files are."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from gym_failures.collection import read_rows
from gym_failures.demo._serve import check_policy_base_url
from gym_failures.demo.launcher import run_demo


def _progress(done: int, total: int) -> None:
    if sys.stderr.isatty():
        print(f"\rcollected {done}/{total} rollouts", end="" if done < total else "\n", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gym_failures.demo",
        description="Run the local demo gym with fault injection and collect its rollouts.",
    )
    parser.add_argument("--out", type=Path, default=Path("runs"), help="parent of the run directory (runs)")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--fault-plan", type=Path, default=None, help="a fault plan JSON file (the packaged default)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model-base-url",
        default=os.environ.get("GYM_DEMO_MODEL_BASE_URL"),
        help="an OpenAI-compatible base URL for the policy instead of the scripted one "
        "($GYM_DEMO_MODEL_BASE_URL), without user info or a query string; the key comes from "
        "$GYM_DEMO_MODEL_API_KEY or $OPENAI_API_KEY",
    )
    parser.add_argument(
        "--model-name",
        default=os.environ.get("GYM_DEMO_MODEL_NAME"),
        help="the external model ($GYM_DEMO_MODEL_NAME)",
    )
    parser.add_argument("--stream", choices=("auto", "always", "never"), default="auto")
    parser.add_argument(
        "--policy-timeout",
        type=float,
        default=None,
        help="seconds one policy call may take (the fault plan's, or 60 with an external model)",
    )
    args = parser.parse_args(argv)
    if (args.model_base_url is None) != (args.model_name is None):
        parser.error("an external policy needs both --model-base-url and --model-name")
    if args.model_base_url is not None:
        try:
            check_policy_base_url(args.model_base_url)
        except ValueError as error:
            parser.error(f"--model-base-url: {error}")  # the message never repeats the URL's secret

    policy_timeout = args.policy_timeout
    if policy_timeout is None and args.model_base_url is not None:
        policy_timeout = 60.0  # a real model generates for seconds, not the scripted milliseconds
    try:
        run_dir = run_demo(
            args.out,
            rollouts=args.rollouts,
            concurrency=args.concurrency,
            fault_plan=args.fault_plan,
            seed=args.seed,
            policy_base_url=args.model_base_url,
            policy_model=args.model_name,
            stream=args.stream,
            policy_timeout_s=policy_timeout,
            on_progress=_progress,
        )
    except KeyboardInterrupt:
        # run_demo has stopped the servers by now; the rows saved so far stay, and a rerun resumes
        # nothing (each run has its own directory), so say where they are rather than a traceback.
        print(f"\ninterrupted; the servers are stopped. Partial runs are under {args.out}/", file=sys.stderr)
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
