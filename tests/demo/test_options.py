"""`DemoOptions`: every demo option's default, its bound, and the one-line error a refused value gives."""

from __future__ import annotations

import argparse
import inspect
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gym_failures.demo import (
    EXTERNAL_POLICY_TIMEOUT_S,
    DemoOptions,
    DemoOptionsError,
    load_fault_plan,
    run_demo,
)
from gym_failures.demo.__main__ import main as demo_main
from gym_failures.demo._plan import ProxyFaults

EXTERNAL = {"policy_base_url": "http://127.0.0.1:9/v1", "policy_model": "external-model"}


def test_the_defaults_are_a_scripted_run_of_the_packaged_plan() -> None:
    options = DemoOptions()
    assert options.model_dump() == {
        "out_dir": Path("runs"),
        "rollouts": 200,
        "num_repeats": 1,
        "concurrency": 16,
        "fault_plan": None,
        "seed": 0,
        "policy_base_url": None,
        "policy_model": None,
        "stream": "auto",
        "policy_timeout_s": None,
        "max_attempts": 3,
        "proxy": True,
    }
    assert options.plan == load_fault_plan()
    assert not options.external_policy


def test_run_demo_takes_every_option_by_its_field_name_and_default() -> None:
    """`run_demo`'s signature repeats the defaults; this keeps the two from drifting apart."""
    parameters = inspect.signature(run_demo).parameters
    defaults = {name: p.default for name, p in parameters.items() if name != "on_progress"}
    assert defaults == DemoOptions().model_dump()


def test_every_flag_names_a_field() -> None:
    assert set(DemoOptions.FLAGS) <= set(DemoOptions.model_fields)


@pytest.mark.parametrize(
    ("field", "flag"),
    [("rollouts", "--rollouts"), ("concurrency", "--concurrency"), ("max_attempts", "max_attempts")],
)
def test_counts_start_at_one(field: str, flag: str) -> None:
    assert getattr(DemoOptions(**{field: 1}), field) == 1
    with pytest.raises(DemoOptionsError) as refused:
        DemoOptions(**{field: 0})
    assert refused.value.option == flag
    assert str(refused.value) == f"{flag}: Input should be greater than or equal to 1"


def test_without_the_proxy_the_plan_injects_none_of_its_faults() -> None:
    assert load_fault_plan().proxy != ProxyFaults()
    options = DemoOptions(proxy=False)
    assert options.plan.proxy == ProxyFaults()
    assert options.plan.model == load_fault_plan().model


def test_a_policy_timeout_must_be_above_zero_and_replaces_the_plans() -> None:
    options = DemoOptions(policy_timeout_s=0.001)
    assert options.plan.limits.policy_timeout_s == 0.001
    assert options.plan.limits.slow_response_s == load_fault_plan().limits.slow_response_s
    with pytest.raises(DemoOptionsError, match=r"^--policy-timeout: Input should be greater than 0$"):
        DemoOptions(policy_timeout_s=0)


def test_an_external_policy_gets_a_real_models_timeout_unless_one_is_given() -> None:
    options = DemoOptions(**EXTERNAL)
    assert options.external_policy
    assert options.policy_timeout_s == EXTERNAL_POLICY_TIMEOUT_S == 60.0
    assert options.plan.limits.policy_timeout_s == 60.0
    assert options.plan.limits.slow_response_s > 60.0
    assert DemoOptions(**EXTERNAL, policy_timeout_s=7.0).plan.limits.policy_timeout_s == 7.0


@pytest.mark.parametrize("given", ["policy_base_url", "policy_model"])
def test_an_external_policy_needs_both_its_url_and_its_model(given: str) -> None:
    with pytest.raises(DemoOptionsError) as refused:
        DemoOptions(**{given: EXTERNAL[given]})
    assert refused.value.option is None
    assert str(refused.value) == "an external policy needs both --model-base-url and --model-name"


def test_a_model_base_url_holding_a_secret_is_refused_without_repeating_it() -> None:
    with pytest.raises(DemoOptionsError) as refused:
        DemoOptions(policy_base_url="http://127.0.0.1:9/v1?key=sk-secret-0123", policy_model="m")
    assert refused.value.option == "--model-base-url"
    assert "query string" in refused.value.reason
    assert "sk-secret" not in str(refused.value)
    assert "sk-secret" not in repr(refused.value.__cause__)


def test_the_stream_mode_is_one_of_three() -> None:
    assert DemoOptions(stream="never").stream == "never"
    with pytest.raises(DemoOptionsError, match=r"^--stream: Input should be 'auto', 'always' or 'never'$"):
        DemoOptions(stream="sometimes")


def test_a_fault_plan_file_is_loaded_once_and_validated_with_the_options(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"model": {"rate_limit": 0.5}}))
    options = DemoOptions(fault_plan=path)
    path.unlink()
    assert options.plan.model.rate_limit == 0.5


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "cannot read {path}: No such file or directory"),
        ({"model": {"rate_limit": 1.5}}, "{path} is not a fault plan: model.rate_limit: Input should be"),
        ({"sandbox": {"segfault": 0.1}}, "{path} is not a fault plan: sandbox.segfault: Extra inputs"),
        ("{not json", "{path} is not a fault plan: Invalid JSON"),
    ],
    ids=["missing", "out-of-range", "unknown-fault", "not-json"],
)
def test_a_fault_plan_that_cannot_be_run_is_refused_in_one_line(
    tmp_path: Path, content: Any, reason: str
) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DemoOptionsError) as refused:
        DemoOptions(fault_plan=path)
    assert refused.value.option == "--fault-plan"
    assert refused.value.reason.startswith(reason.format(path=path))
    assert "\n" not in str(refused.value)


def test_a_directory_is_not_a_fault_plan(tmp_path: Path) -> None:
    with pytest.raises(DemoOptionsError, match=r"^--fault-plan: cannot read .*: Is a directory$"):
        DemoOptions(fault_plan=tmp_path)


def test_a_misspelt_option_is_refused() -> None:
    with pytest.raises(DemoOptionsError, match=r"^rollout: Extra inputs are not permitted$"):
        DemoOptions(rollout=3)


def test_the_error_is_a_value_error_that_pickles() -> None:
    error = DemoOptionsError("Input should be greater than or equal to 1", "--rollouts")
    assert isinstance(error, ValueError)
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.reason, again.option, str(again)) == (
        DemoOptionsError,
        error.reason,
        error.option,
        "--rollouts: Input should be greater than or equal to 1",
    )


def test_run_demo_refuses_a_bad_option_before_writing_anything(tmp_path: Path) -> None:
    with pytest.raises(DemoOptionsError, match=r"^--concurrency: "):
        run_demo(tmp_path / "runs", concurrency=0)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--rollouts", "0"], "argument --rollouts: 0 is below the minimum 1 (see `"),
        (["--model-name", "m"], "an external policy needs both --model-base-url and --model-name"),
        (["--stream", "sometimes"], "argument --stream: invalid choice: 'sometimes'"),
    ],
)
def test_the_command_line_shows_a_refused_option_as_one_usage_line(
    tmp_path: Path, argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m gym_failures.demo` is `gym-failures demo`: its errors are that command's."""
    assert demo_main(["--out", str(tmp_path / "runs"), *argv]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert error.startswith(f"gym-failures demo: error: {line}")
    assert not (tmp_path / "runs").exists()


def test_python_m_gym_failures_demo_is_gym_failures_demo_with_its_one_help_text() -> None:
    """One parser, one help text: the module runs the command line's `demo`."""
    helps = [
        subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
        for command in (
            [sys.executable, "-m", "gym_failures.demo"],
            [sys.executable, "-m", "gym_failures.cli", "demo"],
        )
    ]
    assert helps[0] == helps[1]
    assert helps[0].startswith("usage: gym-failures demo ")


def test_the_demo_commands_help_shows_the_defaults_of_demo_options() -> None:
    """`gym-failures demo --help` names the defaults without importing the demo; they are
    `DemoOptions`' own."""
    from gym_failures.cli._app import build_parser

    parser = build_parser()
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    demo = commands.choices["demo"]
    defaults = DemoOptions().model_dump()
    by_flag = {flag: field for field, flag in DemoOptions.FLAGS.items()}
    flags = [action for action in demo._actions if action.option_strings and action.dest != "help"]
    assert sorted(action.option_strings[0] for action in flags) == sorted(by_flag)
    for action in flags:
        assert action.default == defaults[by_flag[action.option_strings[0]]], action.option_strings


def test_python_m_gym_failures_demo_shows_no_validation_dump(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"limits": {"policy_timeout_s": 3.0, "slow_response_s": 2.0}}))
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.demo", "--out", str(tmp_path), "--fault-plan", str(plan)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"gym-failures demo: error: --fault-plan: {plan} is not a fault plan: "
        "limits: slow_response_s must exceed policy_timeout_s"
    )
    assert "validation error" not in done.stderr
    assert "Traceback" not in done.stderr
