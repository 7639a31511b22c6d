"""What still bit a new user re-trying the command line: whole-run exits, missing extras, busy ports,
a run's rows named alone, run directories as outputs, and messages in the command line's words."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gym_failures.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from gym_failures.cli._demo import next_steps
from gym_failures.reporting.explain import longest_chain
from gym_failures.rows import row_files
from tests.cli.invoke import run_cli
from tests.processes import free_port
from tests.saved_rows import failure_row, model_503_chain, success_row, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


_run = run_cli


def _lines(stderr: str) -> list[str]:
    """`stderr` without the live view's plain progress lines (stderr is no terminal here)."""
    return [line for line in stderr.splitlines() if not line.startswith("collecting: ")]


def _error(stderr: str, command: str) -> str:
    """The one line of an error, its prefix once: no traceback, no second line."""
    lines = _lines(stderr)
    assert len(lines) == 1, stderr
    prefix = f"gym-failures {command}: error: "
    assert lines[0].startswith(prefix), stderr
    assert f"gym-failures {command}" not in lines[0][len(prefix) :], stderr
    return lines[0][len(prefix) :]


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "tasks.jsonl", [{"id": 0}, {"id": 1}])


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A collection run's three files, as `collect --output out.jsonl` leaves them."""
    write_jsonl(tmp_path / "out.jsonl", [success_row("0:0"), success_row("1:0")])
    write_jsonl(tmp_path / "out_failures.jsonl", [failure_row(model_503_chain(), "2:0")])
    (tmp_path / "out.manifest.json").write_text(json.dumps({"version": 2, "expected_rollouts": 3}))
    return tmp_path / "out.jsonl"


# --- collect: the whole run's exit status ------------------------------------------------------


def test_a_rerun_of_a_run_where_nothing_succeeded_still_exits_1(tmp_path: Path, tasks: Path) -> None:
    command = ("collect", tasks, "--agent-url", f"http://127.0.0.1:{free_port()}", "--output")
    first = _run(*command, tmp_path / "out.jsonl", "--max-attempts", "1")
    again = _run(*command, tmp_path / "out.jsonl", "--max-attempts", "1")
    assert (first[0], again[0]) == (EXIT_FAILED, EXIT_FAILED)
    assert _lines(again[2]) == [
        "gym-failures collect: none of 2 rollouts succeeded, all done by an earlier run "
        "(transport_unreachable 2)"
    ]


@pytest.mark.parametrize(
    "spoil",
    [
        {"rollout_failure": "oops"},
        {"rollout_failure": {"http_status": [503]}},
        {"rollout_failure": {"http_status": 200}},
        {"failure": "not a mapping"},
        {"failure": {"failure_kind": ["x"]}},
    ],
)
def test_a_rerun_over_rows_of_the_wrong_shape_still_says_one_line(
    tmp_path: Path, tasks: Path, spoil: dict[str, Any]
) -> None:
    """The rows of a resumed run are read, never trusted; and an episode failure's 200 is no answer."""
    command = ("collect", tasks, "--agent-url", f"http://127.0.0.1:{free_port()}", "--output")
    assert _run(*command, tmp_path / "out.jsonl", "--max-attempts", "1")[0] == EXIT_FAILED
    failures = tmp_path / "out_failures.jsonl"
    rows = [{**json.loads(line), **spoil} for line in failures.read_text().splitlines()]
    failures.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, _, stderr = _run(*command, tmp_path / "out.jsonl", "--max-attempts", "1")
    assert code == EXIT_FAILED
    (line,) = _lines(stderr)
    assert line.startswith("gym-failures collect: none of 2 rollouts succeeded, all done by an earlier run (")
    assert "answered" not in line


def test_a_rerun_of_a_run_with_a_success_exits_0(tmp_path: Path, agent_url: str) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "ok"}])
    command = ("collect", tasks, "--agent-url", agent_url, "--output", tmp_path / "out.jsonl", "--json")
    assert _run(*command)[0] == EXIT_OK
    code, stdout, _ = _run(*command)
    assert (code, json.loads(stdout)["already_done"], json.loads(stdout)["succeeded"]) == (EXIT_OK, 1, 0)


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (b"", "an empty file"),
        (b"not json\n[1]\n", "2 invalid lines, the first line 1"),
        (b"\n\n", "2 blank lines"),
        (b'\n"x"\n', "1 invalid line, the first line 2; 1 blank line"),
    ],
    ids=["empty", "invalid", "blank", "both"],
)
def test_a_task_file_without_a_task_is_exit_2_and_writes_nothing(
    tmp_path: Path, content: bytes, found: str
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(content)
    code, stdout, stderr = _run(
        "collect", tasks, "--agent-url", "http://127.0.0.1:9", "--output", tmp_path / "o"
    )
    assert (code, stdout) == (EXIT_USAGE, "")
    assert _error(stderr, "collect") == f"no tasks in {tasks} ({found})"
    assert list(tmp_path.iterdir()) == [tasks]


def test_a_directory_as_the_task_file_is_named_so(tmp_path: Path) -> None:
    code, _, stderr = _run("collect", tmp_path, "--agent-url", "http://127.0.0.1:9", "--output", "o.jsonl")
    assert code == EXIT_USAGE
    assert _error(stderr, "collect") == f"{tmp_path} is a directory; name the task file"


# --- a missing extra, a busy port --------------------------------------------------------------


@pytest.mark.parametrize("command", ["collect", "serve"])
def test_metrics_port_without_the_prometheus_extra_is_exit_2_when_the_options_are_read(
    tmp_path: Path, tasks: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dev install has the extra: None in sys.modules makes `prometheus_client` unimportable, as
    where the extra is not installed. The port given is held, so a check made too late fails as a
    busy port rather than serving."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        options = (
            ("collect", tasks, "--agent-url", "http://127.0.0.1:9", "--output", tmp_path / "o.jsonl")
            if command == "collect"
            else ("serve", "model", "--port", port)
        )
        code, stdout, stderr = _run(*options, "--metrics-port", port)
    assert (code, stdout) == (EXIT_USAGE, "")
    assert _error(stderr, command) == (
        "--metrics-port needs the prometheus extra (prometheus_client is not installed): "
        "pip install 'gym-failures[prometheus]'"
    )
    assert not (tmp_path / "o.jsonl").exists()


def test_a_commands_missing_extras_are_named_as_pip_spells_them(tasks: Path) -> None:
    """None in sys.modules makes `import aiohttp` fail as it does where the extra is not installed; in
    a new process, since this one may hold the collection imported already."""
    code = "import sys; sys.modules['aiohttp'] = None; from gym_failures.cli import main; sys.exit(main())"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "collect",
            str(tasks),
            "--agent-url",
            "http://127.0.0.1:9",
            "--output",
            "o",
        ],
        cwd=tasks.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_USAGE
    assert _error(done.stderr, "collect") == (
        "this command needs the aiohttp and cli extras (aiohttp is not installed): "
        "pip install 'gym-failures[aiohttp,cli]'"
    )


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port a real socket listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_serve_on_a_busy_port_is_one_line_and_exit_2(held_port: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "serve", "model", "--port", str(held_port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr == f"gym-failures serve: error: port {held_port} is in use\n"


def test_a_plan_that_is_not_valid_names_the_first_problem(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"rates": {"quota_429": 5, "server_503": -1}}', encoding="utf-8")
    code, _, stderr = _run("serve", "model", "--fault-plan", plan)
    assert code == EXIT_USAGE
    assert _error(stderr, "serve") == (
        f"--fault-plan {plan}: not a valid plan: rates.quota_429: Input should be less than or equal "
        "to 1 (and 1 more)"
    )


def test_a_plan_with_an_unknown_fault_names_the_key(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"rates": {"bogus": 0.1}}', encoding="utf-8")
    code, _, stderr = _run("serve", "model", "--fault-plan", plan)
    assert code == EXIT_USAGE
    assert _error(stderr, "serve").startswith(
        f"--fault-plan {plan}: not a valid plan: rates, key 'bogus': Input should be 'quota_429', "
    )


@pytest.mark.parametrize("command", [("serve", "model"), ("demo",)])
def test_a_fault_plan_that_is_a_directory_says_so(tmp_path: Path, command: tuple[str, ...]) -> None:
    code, _, stderr = _run(*command, "--fault-plan", tmp_path)
    assert code == EXIT_USAGE
    assert _error(stderr, command[0]) == f"--fault-plan {tmp_path} is a directory; name a file"


def test_a_task_file_that_is_no_regular_file_says_so() -> None:
    code, _, stderr = _run("collect", "/dev/null", "--agent-url", "http://127.0.0.1:9", "--output", "o")
    assert code == EXIT_USAGE
    assert _error(stderr, "collect") == "/dev/null is not a regular file"


# --- inputs ------------------------------------------------------------------------------------


def test_a_runs_rows_named_alone_bring_its_failures_and_say_so(run: Path) -> None:
    code, stdout, stderr = _run("gate", run, "--json")
    assert code in (EXIT_OK, EXIT_FAILED)
    assert stderr == f"reading {run.parent / 'out_failures.jsonl'} too: the failures of {run}'s run\n"
    assert json.loads(stdout)["coverage"]["missing"] == 0


def test_rows_of_no_run_or_named_with_their_failures_bring_nothing(run: Path, tmp_path: Path) -> None:
    loose = write_jsonl(tmp_path / "loose.jsonl", [success_row("0:0")])
    write_jsonl(tmp_path / "loose_failures.jsonl", [failure_row(model_503_chain(), "1:0")])
    for paths in ([loose], [run, run.parent / "out_failures.jsonl"], [run.parent / "out_failures.jsonl"]):
        code, stdout, stderr = _run("summarize", *paths, "--json")
        assert (code, stderr) == (EXIT_OK, "")
        assert json.loads(stdout)["files"] == [str(path) for path in paths]


def test_explain_line_reads_the_one_file_named(run: Path) -> None:
    code, stdout, stderr = _run("explain", run, "--line", "1", "--json")
    assert (code, stderr) == (EXIT_OK, "")
    assert [item["path"] for item in json.loads(stdout)] == [str(run)]


def test_explain_file_colon_line_says_retried_as_the_trees_label_does(tmp_path: Path) -> None:
    """`FILE:N` pasted from a label explains the row as the label printed it: a failure a later attempt
    of its rollout followed (in the run's other file) is retried, as `--rollout` says too."""
    write_jsonl(tmp_path / "out.jsonl", [success_row("2:0", attempt=2)])
    failures = write_jsonl(
        tmp_path / "out_failures.jsonl", [failure_row(model_503_chain(), "2:0", attempt=1, final=False)]
    )
    (tmp_path / "out.manifest.json").write_text(json.dumps({"version": 2, "expected_rollouts": 1}))
    by_line = json.loads(_run("explain", f"{failures}:1", "--json")[1])
    by_rollout = json.loads(_run("explain", tmp_path, "--rollout", "2:0", "--json")[1])
    assert [item["retried"] for item in by_line] == [True]
    assert [(item["line"], item["retried"]) for item in by_rollout if item["attempt"] == 1] == [(1, True)]


def test_a_path_given_twice_counts_once(run: Path) -> None:
    once = json.loads(_run("summarize", run.parent, "--json")[1])
    code, stdout, _ = _run("summarize", run.parent, run.parent, run, f"{run.parent}/./out.jsonl", "--json")
    twice = json.loads(stdout)
    assert code == EXIT_OK
    assert (twice["rows"], twice["files"]) == (once["rows"], once["files"])
    explained = json.loads(_run("explain", run, run, "--rollout", "0:0", "--json")[1])
    assert len(explained) == 1


# --- collect --output and the words of its messages --------------------------------------------


def test_collect_into_a_demo_run_directory_resumes_its_rows(tmp_path: Path, agent_url: str) -> None:
    run = tmp_path / "run"
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "ok"}, {"mode": "ok"}])
    assert _run("collect", tasks, "--agent-url", agent_url, "--output", run / "rollouts.jsonl")[0] == EXIT_OK
    write_jsonl(run / "tasks.jsonl", [{"mode": "ok"}])  # what else a demo's run directory holds
    write_jsonl(run / "injected_faults.jsonl", [{"fault": "x"}])
    code, stdout, stderr = _run("collect", tasks, "--agent-url", agent_url, "--output", run, "--json")
    assert (code, _lines(stderr)) == (EXIT_OK, [])
    assert json.loads(stdout)["already_done"] == 2
    assert row_files(run) == [run / "rollouts.jsonl", run / "rollouts_failures.jsonl"]


def test_a_refused_resume_names_the_flags_and_keeps_its_paths(tmp_path: Path, tasks: Path) -> None:
    output = tmp_path / "output_path num_repeats" / "o.jsonl"
    command = ("collect", tasks, "--agent-url", f"http://127.0.0.1:{free_port()}", "--output", output)
    assert _run(*command, "--max-attempts", "1")[0] == EXIT_FAILED
    code, _, stderr = _run(*command, "--num-repeats", "2")
    assert code == EXIT_USAGE
    assert _error(stderr, "collect") == (
        f"{output} was collected from a different input or --num-repeats (manifest differs); use a new "
        "--output, or pass --force-resume"
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:99999", "the port 99999 is out of range (0-65535)"),
        ("http://user:Zq9Secret@[::1]:70000/", "the port 70000 is out of range (0-65535)"),
        ("http://127.0.0.1:Zq9Secret/", "the host is not followed by a valid port"),
        ("http://h:1:2/", "the host is not followed by a valid port"),
        ("http://[::1]:1:5/", "the host is not followed by a valid port"),
        ("http://h:-1/", "the host is not followed by a valid port"),
        ("http://h:65536/", "the port 65536 is out of range (0-65535)"),
    ],
)
def test_an_agent_url_with_a_bad_port_says_so(tasks: Path, url: str, message: str) -> None:
    code, _, stderr = _run("collect", tasks, "--agent-url", url, "--output", "o.jsonl")
    assert code == EXIT_USAGE
    assert _error(stderr, "collect").startswith(f"argument --agent-url: {message} (see `")
    assert "Zq9Secret" not in stderr


@pytest.mark.parametrize(
    "command",
    [
        ("serve", "model", "--port"),
        ("collect", "t", "--agent-url", "http://h", "--output", "o", "--metrics-port"),
    ],
    ids=["port", "metrics-port"],
)
def test_a_port_out_of_range_is_said_as_for_the_agent_url(command: tuple[str, ...]) -> None:
    code, _, stderr = _run(*command, "70000")
    assert code == EXIT_USAGE
    assert f"argument {command[-1]}: the port 70000 is out of range (0-65535) (see `" in stderr


def test_an_agent_url_without_a_host_names_the_option(tasks: Path) -> None:
    code, _, stderr = _run("collect", tasks, "--agent-url", "ftp://x", "--output", "o.jsonl")
    assert code == EXIT_USAGE
    assert _error(stderr, "collect") == "--agent-url must be an http(s) URL with a host"


def test_an_output_directory_of_several_row_files_and_no_manifest_is_named(
    tmp_path: Path, tasks: Path
) -> None:
    (tmp_path / "run").mkdir()
    write_jsonl(tmp_path / "run" / "a.jsonl", [success_row("0:0")])
    write_jsonl(tmp_path / "run" / "b.jsonl", [success_row("0:0")])
    code, _, stderr = _run(
        "collect", tasks, "--agent-url", "http://127.0.0.1:9", "--output", tmp_path / "run"
    )
    assert code == EXIT_USAGE
    assert _error(stderr, "collect") == (
        f"--output {tmp_path / 'run'} is a directory with several row files (a.jsonl, b.jsonl); name one"
    )


def test_collect_refuses_the_task_file_as_its_output(tasks: Path) -> None:
    before = tasks.read_bytes()
    code, _, stderr = _run("collect", tasks, "--agent-url", "http://127.0.0.1:9", "--output", tasks)
    assert code == EXIT_USAGE
    assert (
        _error(stderr, "collect") == f"--output {tasks} would write its rows into the task file; name another"
    )
    assert tasks.read_bytes() == before


def test_collect_refuses_an_output_whose_failures_file_is_the_task_file(tmp_path: Path) -> None:
    tasks = tmp_path / "x_failures.jsonl"
    tasks.write_text('{"id": "a"}\n')
    output = tmp_path / "x.jsonl"
    for force in ((), ("--force-resume",)):
        code, _, stderr = _run(
            "collect", tasks, "--agent-url", "http://127.0.0.1:9", "--output", output, *force
        )
        assert code == EXIT_USAGE
        expected = f"--output {output} would write its failure rows into the task file; name another"
        assert _error(stderr, "collect") == expected
    assert tasks.read_text() == '{"id": "a"}\n'
    assert not output.exists()


def test_an_output_directory_holding_the_task_file_gets_its_own_rows_file(tmp_path: Path) -> None:
    """`collect d/tasks.jsonl --output d`: the task file is no candidate for the run's rows."""
    run = tmp_path / "d"
    run.mkdir()
    tasks = run / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n')
    code, _, _ = _run("collect", tasks, "--agent-url", "http://127.0.0.1:9", "--output", run)
    assert code == EXIT_FAILED
    assert tasks.read_text() == '{"id": "a"}\n'
    assert (run / "rollouts_failures.jsonl").is_file()


# --- wording -----------------------------------------------------------------------------------


def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", [{"note": "no rollout"}])
    code, _, stderr = _run("summarize", path)
    assert code == EXIT_USAGE
    assert _error(stderr, "summarize") == f"no rollout rows in {path} (1 other line)"
    path = write_jsonl(tmp_path / "rows.jsonl", [success_row("0:0")], tail=b"x\n")
    assert _run("summarize", path)[2] == (
        "warning: 1 line is not a rollout row (not JSON, or neither a result nor a failure)\n"
    )
    assert _run("gate", path, "--expected", "1")[2] == "warning: 1 invalid line skipped\n"


def test_the_librarys_warnings_are_spelled_as_the_commands_are(tmp_path: Path) -> None:
    """In a real process (no logging configured), the collection's warning about a task line."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('not json\n{"id": 1}\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gym_failures.cli",
            "collect",
            str(tasks),
            "--output",
            str(tmp_path / "o"),
            "--agent-url",
            f"http://127.0.0.1:{free_port()}",
            "--max-attempts",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_FAILED
    assert f"warning: {tasks}:1: a task line that is not a JSON object, skipped" in done.stderr.splitlines()
    assert "WARNING" not in done.stderr


def test_the_demos_hint_names_a_failed_rollout_and_works_as_pasted(run: Path) -> None:
    files = row_files(run.parent)
    steps = next_steps(run.parent, longest_chain(files))
    assert len(steps) == 2
    explain = shlex.split(steps[0])
    assert "--rollout" in explain
    assert "<id>" not in steps[0]
    code, stdout, stderr = _run(*explain[explain.index("explain") :], "--json")
    assert (code, stderr) == (EXIT_OK, "")
    assert [item["outcome"] for item in json.loads(stdout)] == ["failure"]
    gate = shlex.split(steps[1])
    assert _run(*gate[gate.index("gate") :])[0] in (EXIT_OK, EXIT_FAILED)


def test_a_directory_of_runs_names_them(tmp_path: Path) -> None:
    """`summarize runs/` (the demo's parent directory) names the newest runs inside, to pick from."""
    for name in ("20261130T090000Z", "20261130T100000Z", "20261130T110000Z", "20261130T120000Z"):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "rollouts.jsonl", [success_row("0:0")])
    (tmp_path / "notes").mkdir()
    code, _, stderr = _run("summarize", tmp_path)
    assert code == EXIT_USAGE
    newest = ", ".join(shlex.quote(str(tmp_path / name)) for name in ("20261130T120000Z", "20261130T110000Z"))
    assert _error(stderr, "summarize") == (
        f"{tmp_path}: no row files (*.jsonl) in this directory; it holds 4 runs: {newest}, "
        f"{shlex.quote(str(tmp_path / '20261130T100000Z'))} and 1 more (name one)"
    )


def test_a_fresh_nemo_gym_run_needs_the_agents_name(tmp_path: Path) -> None:
    """Issue 31: without `--agent-name` every row named the agent `agent`, which NeMo Gym refuses."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"responses_create_params": {"input": "2 + 2?"}}\n')
    output = tmp_path / "run.jsonl"
    code, _, err = _run(
        "collect",
        tasks,
        "--agent-url",
        "http://127.0.0.1:9",
        "--output",
        output,
        "--agent-protocol",
        "nemo-gym",
    )
    assert code == EXIT_USAGE
    assert "--agent-protocol nemo-gym needs --agent-name" in err
    assert "Traceback" not in err
    assert not output.exists()
