"""`gym-failures demo`, which `python -m gym_failures.demo` runs too: start the local demo gym with
injected faults, collect its rollouts, then print the summary, the gate's verdict and the cause
tree of the failed attempt with the longest cause chain, write `report.html`, and say what to run
next.

Decisions:

- One parser, one help text, one output: `python -m gym_failures.demo` is this command (its
  `__main__` runs `gym-failures demo` with its arguments), so the two cannot drift apart. The
  options' defaults are `gym_failures.demo.DemoOptions`' (a test keeps the help's equal to them);
  they are repeated here because building the parser must not import the demo (pydantic, its
  servers' modules).
- An option a type here cannot refuse (a model URL with secrets, a fault plan that is not one) is
  refused by `DemoOptions`, as one line naming its flag, never the URL.
- The next steps name the program as it was run (`gym_failures.cli._shell.program`), each to paste
  as printed; line numbers are 1-based.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gym_failures.cli._exits import EXIT_INTERRUPTED, EXIT_OK, CommandError
from gym_failures.cli._inputs import require_file
from gym_failures.cli._options import Subcommands, add_command, at_least, positive_seconds
from gym_failures.cli._shell import program, shell_path
from gym_failures.cli._text import stderr_line

if TYPE_CHECKING:
    from gym_failures.reporting.explain import RowExplanation

__all__ = ["add_demo", "add_demo_options", "next_steps"]


def add_demo(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "demo",
        _run_demo,
        help="run a local gym with injected faults, then summarize, gate and explain it",
        description="Start a model server, a resources server (verifier, judge, sandbox), a chaos proxy "
        "in front of it and an agent server on loopback, collect the rollouts into OUT/<timestamp>/, "
        "print the summary, the gate's "
        "verdict and the cause tree of the failed attempt with the longest cause chain, and write "
        "report.html there. Needs the demo extra.",
        extra="demo",
    )
    add_demo_options(parser)


def add_demo_options(parser: argparse.ArgumentParser) -> None:
    """The demo's options, on `parser`: the one definition of them."""
    parser.add_argument("--out", type=Path, default=Path("runs"), help="parent of the run directory (runs)")
    parser.add_argument(
        "--rollouts",
        type=at_least(1),
        default=200,
        metavar="N",
        help="tasks, each collected --num-repeats times (200)",
    )
    parser.add_argument(
        "--num-repeats",
        type=at_least(1),
        default=1,
        metavar="R",
        help="rollouts of each task, a prompt group (1); with R > 1 the gate also counts the groups "
        "that keep at least half their members valid",
    )
    parser.add_argument("--concurrency", type=at_least(1), default=16, metavar="N", help="in flight (16)")
    parser.add_argument(
        "--fault-plan", type=Path, metavar="FILE", help="a fault plan JSON (the packaged one)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the scripted policy and the fault draws (0)"
    )
    parser.add_argument(
        "--model-base-url",
        metavar="URL",
        help="an OpenAI-compatible base URL for the policy instead of the scripted one (or "
        "$GYM_DEMO_MODEL_BASE_URL); its key comes from $GYM_DEMO_MODEL_API_KEY or $OPENAI_API_KEY",
    )
    parser.add_argument(
        "--model-name", metavar="NAME", help="the external policy model (or $GYM_DEMO_MODEL_NAME)"
    )
    parser.add_argument(
        "--stream",
        choices=("auto", "always", "never"),
        default="auto",
        help="whether policy calls stream (auto)",
    )
    parser.add_argument(
        "--policy-timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help="one policy call's limit (default: the fault plan's, or 60 with an external model)",
    )
    parser.add_argument(
        "--no-proxy",
        dest="proxy",
        action="store_false",
        help="no chaos proxy in front of the resources server: the agent calls it directly, and the "
        "plan's proxy faults are not injected",
    )


def _run_demo(arguments: argparse.Namespace) -> int:
    import os

    from gym_failures.cli._live import live_collection
    from gym_failures.demo import DemoOptionsError, run_demo

    if arguments.fault_plan is not None:
        require_file(arguments.fault_plan, f"--fault-plan {arguments.fault_plan}")
    with live_collection() as on_progress:
        try:
            run_dir = run_demo(
                arguments.out,
                rollouts=arguments.rollouts,
                num_repeats=arguments.num_repeats,
                concurrency=arguments.concurrency,
                fault_plan=arguments.fault_plan,
                seed=arguments.seed,
                policy_base_url=arguments.model_base_url or os.environ.get("GYM_DEMO_MODEL_BASE_URL"),
                policy_model=arguments.model_name or os.environ.get("GYM_DEMO_MODEL_NAME"),
                stream=arguments.stream,
                policy_timeout_s=arguments.policy_timeout,
                proxy=arguments.proxy,
                on_progress=on_progress,
            )
        except KeyboardInterrupt:
            stderr_line("gym-failures demo: interrupted; every demo server is stopped")
            return EXIT_INTERRUPTED
        except DemoOptionsError as error:  # a refused option (a model URL with secrets); never echoes them
            raise CommandError(str(error)) from None
    _show_demo(run_dir, arguments.rollouts, arguments.num_repeats)
    return EXIT_OK


def _show_demo(run_dir: Path, rollouts: int, num_repeats: int = 1) -> None:
    from gym_failures import gate as acceptance
    from gym_failures.cli._console import print_rule, print_tree, stdout_line
    from gym_failures.cli._tables import print_summary, print_verdict
    from gym_failures.cli._tree import explanation_tree
    from gym_failures.reporting.explain import longest_chain, with_retried
    from gym_failures.reporting.html import render_html
    from gym_failures.reporting.summary import summarize

    files = [run_dir / "rollouts.jsonl", run_dir / "rollouts_failures.jsonl"]
    summary = summarize(files)
    # With prompt groups, the groups that keep at least half their members valid (docs/trainers.md).
    groups = (num_repeats + 1) // 2 if num_repeats > 1 else None
    # The groups' members are read from the run's materialized inputs (the expected count with them).
    expected = None if groups is not None else rollouts
    coverage = acceptance.read_coverage(files, expected, min_valid_per_group=groups)
    verdict = acceptance.check(coverage, acceptance.GateThresholds())
    explanation = with_retried(longest_chain(files[1:]), files)
    report = run_dir / "report.html"
    report.write_text(render_html(summary, verdict=verdict, explanation=explanation), encoding="utf-8")
    print_rule("Summary")
    print_summary(summary)
    print_rule("Acceptance gate")
    print_verdict(verdict)
    if explanation is not None:
        print_rule("The failed attempt with the longest cause chain")
        print_tree(explanation_tree(explanation))
    print_rule("Files")
    stdout_line(f"rows:        {files[0]}\nfailures:    {files[1]}\nHTML report: {report}")
    stdout_line("Next: " + "\n      ".join(next_steps(run_dir, explanation)), style="dim")


def next_steps(run_dir: Path, explanation: RowExplanation | None) -> list[str]:
    """The commands the demo suggests after its run in `run_dir`, each one to paste as printed:
    `explain` of the rollout of `explanation` (the failed attempt it showed), and `gate`."""
    import shlex

    binary = program()
    steps = [f"{binary} gate {shell_path(run_dir)}"]
    if explanation is not None and explanation.rollout_id is not None:
        rollout = shlex.quote(explanation.rollout_id)
        steps.insert(0, f"{binary} explain {shell_path(run_dir)} --rollout {rollout}")
    return steps
