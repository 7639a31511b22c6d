"""What a new user meets first: exit statuses, one-line errors, inputs, hints and a lazy start-up."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gym_failures.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from gym_failures.cli._gate import GATE_DEFAULTS
from gym_failures.cli._shell import program
from gym_failures.gate import GateThresholds
from gym_failures.rows import row_files
from tests.cli.invoke import run_cli
from tests.processes import free_port
from tests.saved_rows import failure_row, model_503_chain, success_row, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


_run = run_cli


def _one_error_line(stderr: str, command: str) -> str:
    """The one line of an error: no traceback, no usage block, no validation dump."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"gym-failures {command}: error: "), stderr
    assert "Traceback" not in stderr
    assert "errors.pydantic.dev" not in stderr
    return lines[0]


@pytest.fixture
def demo_like_run(tmp_path: Path) -> Path:
    """A run directory as the demo leaves it: row files named by a manifest, beside other JSONL."""
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "rollouts.jsonl", [success_row("0:0"), success_row("1:0")])
    write_jsonl(run / "rollouts_failures.jsonl", [failure_row(model_503_chain(), "2:0")])
    (run / "rollouts.manifest.json").write_text(json.dumps({"version": 2, "expected_rollouts": 3}))
    write_jsonl(run / "tasks.jsonl", [{"id": index} for index in range(3)])
    write_jsonl(run / "injected_faults.jsonl", [{"fault": "x"}] * 5)
    return run


# --- inputs ------------------------------------------------------------------------------------


def test_a_run_directory_stands_for_the_row_files_its_manifest_names(demo_like_run: Path) -> None:
    assert row_files(demo_like_run) == [
        demo_like_run / "rollouts.jsonl",
        demo_like_run / "rollouts_failures.jsonl",
    ]


def test_a_directory_without_a_manifest_stands_for_every_jsonl_in_it(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", [success_row("0:0")])
    write_jsonl(tmp_path / "a.jsonl", [success_row("1:0")])
    assert row_files(tmp_path) == [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]


def test_summarize_on_a_run_directory_reads_no_tasks_or_injected_faults(demo_like_run: Path) -> None:
    code, stdout, stderr = _run("summarize", demo_like_run, "--json")
    summary = json.loads(stdout)
    assert (code, stderr) == (EXIT_OK, "")
    assert (summary["rows"], summary["other_rows"]) == (3, 0)
    assert summary["files"] == [str(path) for path in row_files(demo_like_run)]


@pytest.mark.parametrize("command", ["summarize", "gate", "explain"])
def test_an_empty_directory_is_one_error_line_and_exit_2(tmp_path: Path, command: str) -> None:
    options = ["--rollout", "0:0"] if command == "explain" else []
    code, stdout, stderr = _run(command, tmp_path, *options)
    assert (code, stdout) == (EXIT_USAGE, "")
    assert _one_error_line(stderr, command).endswith(f"{tmp_path}: no row files (*.jsonl) in this directory")


def test_summarize_warns_about_lines_that_are_no_rows(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rows.jsonl", [success_row("0:0")], tail=b"not json\n")
    code, _, stderr = _run("summarize", path)
    assert code == EXIT_OK
    assert stderr == "warning: 1 line is not a rollout row (not JSON, or neither a result nor a failure)\n"


def test_gate_with_a_manifest_but_no_rows_warns_and_fails_as_missing(tmp_path: Path) -> None:
    (tmp_path / "rollouts.jsonl").write_bytes(b"")
    (tmp_path / "rollouts.manifest.json").write_text(json.dumps({"expected_rollouts": 4}))
    code, stdout, stderr = _run("gate", tmp_path)
    assert code == EXIT_FAILED
    assert "warning: no rollout rows in" in stderr
    assert "0 of 4 scored" in stdout


# --- one-line errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "message"),
    [("missing/x.html", "the directory {tmp}/missing does not exist"), (".", "is a directory; name a file")],
    ids=["missing-directory", "a-directory"],
)
def test_summarize_html_to_a_place_it_cannot_write_is_one_line(
    demo_like_run: Path, tmp_path: Path, where: str, message: str
) -> None:
    code, stdout, stderr = _run("summarize", demo_like_run, "--html", tmp_path / where)
    assert (code, stdout) == (EXIT_USAGE, "")
    assert _one_error_line(stderr, "summarize").endswith(message.format(tmp=tmp_path))


def test_a_file_that_cannot_be_read_is_one_line() -> None:
    """/proc/self/mem is a regular file whose first page cannot be read (EIO), even by root."""
    code, _, stderr = _run("gate", "/proc/self/mem")
    assert code == EXIT_USAGE
    assert _one_error_line(stderr, "gate") == "gym-failures gate: error: /proc/self/mem: Input/output error"


def test_a_bad_option_value_is_one_line_naming_the_help(demo_like_run: Path) -> None:
    code, _, stderr = _run("gate", demo_like_run, "--min-scored-share", "1.5")
    assert code == EXIT_USAGE
    line = _one_error_line(stderr, "gate")
    assert "--min-scored-share: 1.5 is not a share between 0 and 1" in line
    assert line.endswith("gate --help`)")


def test_an_unknown_option_is_one_line(demo_like_run: Path) -> None:
    code, _, stderr = _run("explain", demo_like_run / "rollouts.jsonl", "--line", "1", "--row", "0")
    assert code == EXIT_USAGE
    assert "unrecognized arguments: --row 0" in _one_error_line(stderr, "explain")


def test_a_command_whose_extra_is_missing_says_which_and_exits_2(
    demo_like_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """None in sys.modules makes `import duckdb` fail as it does where the extra is not installed."""
    monkeypatch.setitem(sys.modules, "duckdb", None)
    code, stdout, stderr = _run("summarize", demo_like_run)
    assert (code, stdout) == (EXIT_USAGE, "")
    assert _one_error_line(stderr, "summarize") == (
        "gym-failures summarize: error: this command needs the cli extra (duckdb is not installed): "
        "pip install 'gym-failures[cli]'"
    )


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    code, stdout, _ = _run("--version")
    assert (code, stdout) == (EXIT_OK, f"gym-failures {version('gym-failures')}\n")


def test_help_lists_the_exit_statuses() -> None:
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stdout(io.StringIO()) as stdout:
        main(["gate", "--help"])
    assert exit_info.value.code == 0
    text = stdout.getvalue()
    assert "exit status:" in text
    assert "1    done, and the answer is no: gate failed the run" in text
    assert "(default 0.95)" in text


def test_the_gate_defaults_shown_in_help_are_the_gates() -> None:
    assert GateThresholds().as_dict() == GATE_DEFAULTS


# --- collect -----------------------------------------------------------------------------------


def test_collect_exits_1_naming_the_agent_when_it_cannot_be_reached(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"id": index} for index in range(5)])
    url = f"http://127.0.0.1:{free_port()}"
    code, _, stderr = _run(
        "collect", tasks, "--agent-url", url, "--output", tmp_path / "out.jsonl", "--max-attempts", "1"
    )
    assert code == EXIT_FAILED
    assert (
        without_progress(stderr)
        == f"gym-failures collect: the agent at {url} could not be reached (transport_unreachable 5)\n"
    )


class _NotImplemented(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(501)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def wrong_server() -> Iterator[str]:
    """A server that answers every POST with 501, as a wrong service on the agent's port would."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotImplemented)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_collect_exits_1_when_no_rollout_succeeded(tmp_path: Path, wrong_server: str) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"id": index} for index in range(3)])
    code, _, stderr = _run(
        "collect", tasks, "--agent-url", wrong_server, "--output", tmp_path / "out", "--max-attempts", "1"
    )
    assert code == EXIT_FAILED
    assert without_progress(stderr).splitlines()[-1] == (
        f"gym-failures collect: none of 3 rollouts succeeded: the agent at {wrong_server} answered 501 "
        "(agent_request_failed 3)"
    )


def test_collect_completes_an_output_without_jsonl_and_the_readers_find_it(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "ok"}, {"mode": "ok"}])
    code, _, stderr = _run("collect", tasks, "--agent-url", agent_url, "--output", tmp_path / "run" / "out")
    assert code == EXIT_OK
    assert (
        without_progress(stderr)
        == f"warning: --output {tmp_path / 'run' / 'out'} has no .jsonl suffix: writing "
        f"{tmp_path / 'run' / 'out.jsonl'}\n"
    )
    assert len((tmp_path / "run" / "out.jsonl").read_text().splitlines()) == 2
    summary = json.loads(_run("summarize", tmp_path / "run", "--json")[1])
    assert summary["success_rows"] == 2


def test_collect_refuses_an_output_with_another_suffix(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"mode": "ok"}])
    code, _, stderr = _run(
        "collect", tasks, "--agent-url", "http://127.0.0.1:9", "--output", tmp_path / "o.json"
    )
    assert code == EXIT_USAGE
    assert _one_error_line(stderr, "collect").endswith("the rows' file must end in .jsonl")
    assert list(tmp_path.iterdir()) == [tasks]


# --- lines, hints, start-up --------------------------------------------------------------------


def test_explain_labels_a_row_with_the_line_number_grep_gives(demo_like_run: Path) -> None:
    path = demo_like_run / "rollouts.jsonl"
    grep = subprocess.run(["grep", "-n", '"1:0"', str(path)], capture_output=True, text=True, check=True)
    number = grep.stdout.split(":", 1)[0]
    code, stdout, _ = _run("explain", path, "--line", number)
    assert code == EXIT_OK
    assert f"rollouts.jsonl:{number} rollout 1:0" in " ".join(stdout.split())


def test_the_hint_names_the_program_by_a_path_that_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "venv" / "bin" / "gym-failures"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(binary)])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert program() == "venv/bin/gym-failures"
    monkeypatch.setenv("PATH", f"{binary.parent}:/usr/bin")
    assert program() == "gym-failures"


def test_help_and_the_parser_load_no_rich_duckdb_or_pydantic_models() -> None:
    code = (
        "import contextlib, io, sys\n"
        "from gym_failures.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "heavy = ('rich', 'duckdb', 'typer', 'aiohttp', 'gym_failures.failure_records', 'pydantic.main')\n"
        "print(sorted(name for name in heavy if name in sys.modules))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert loaded.stdout == "[]\n"


def test_gate_json_loads_no_rich_or_duckdb(demo_like_run: Path) -> None:
    code = (
        "import contextlib, io, sys\n"
        "from gym_failures.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['gate', '--json', {str(demo_like_run)!r}])\n"
        "print(sorted(name for name in ('rich', 'duckdb', 'typer', 'aiohttp') if name in sys.modules))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert loaded.stdout == "[]\n"


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(demo_like_run: Path) -> None:
    """`gym-failures summarize RUN | head -1` with the reader gone before the first write."""
    with subprocess.Popen(
        [sys.executable, "-m", "gym_failures.cli", "summarize", str(demo_like_run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    ) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        process.stdout.close()
        stderr = process.stderr.read()
        assert process.wait(timeout=60) == 141
    assert stderr == b""


def test_skipped_lines_are_one_warning_not_one_a_line(tmp_path: Path) -> None:
    """In a real process (no logging configured), three invalid lines make one warning line."""
    path = write_jsonl(tmp_path / "rows.jsonl", [success_row("0:0")], tail=b"x\ny\nz\n")
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "gate", str(path), "--expected", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == EXIT_OK
    assert done.stderr == "warning: 3 invalid lines skipped\n"


def without_progress(stderr: str) -> str:
    """`stderr` without the live view's plain progress lines (stderr is no terminal here)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("collecting: "))


def test_collect_never_prints_the_agent_urls_credentials(tmp_path: Path) -> None:
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{"id": 0}])
    url = f"http://user:Zq9UrlPassword@127.0.0.1:{free_port()}/?token=Zq9UrlQueryToken"
    code, stdout, stderr = _run(
        "collect", tasks, "--agent-url", url, "--output", tmp_path / "out.jsonl", "--max-attempts", "1"
    )
    assert code == EXIT_FAILED
    assert "could not be reached" in stderr
    for secret in ("Zq9UrlPassword", "Zq9UrlQueryToken"):
        assert secret not in stdout + stderr


def test_gate_reads_a_nemo_gym_reward_past_a_floats_range(tmp_path: Path) -> None:
    rows = write_jsonl(
        tmp_path / "rollouts.jsonl", [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 10**400}]
    )
    code, stdout, stderr = _run("gate", rows, "--expected", "1")
    assert code in (EXIT_OK, EXIT_FAILED)
    assert "Traceback" not in stderr
    assert "1 scored" in stdout or "of 1 scored" in stdout


@pytest.mark.parametrize("module", ["uvicorn", "starlette", "aiohttp"])
def test_the_demo_without_its_extra_says_which_and_exits_2(tmp_path: Path, module: str) -> None:
    """`gym_failures.demo` turns the missing module into its own message; it must stay a
    ModuleNotFoundError naming the module, or the command line prints a traceback. A fresh process:
    None in sys.modules before anything is imported fails `import {module}` as a missing package
    does (in this process the collector may have imported it already)."""
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None\n"
        "from gym_failures.cli import main\n"
        f"sys.exit(main(['demo', '--rollouts', '2', '--out', {str(tmp_path)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr == (
        f"gym-failures demo: error: this command needs the demo extra ({module} is not installed): "
        "pip install 'gym-failures[demo]'\n"
    )


def test_the_top_level_help_words_the_exit_statuses_as_the_readme_does() -> None:
    import re

    from gym_failures.cli._exits import EXIT_STATUS_HELP

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    table = readme[readme.index("| Status | Meaning |") :].split("\n\n")[0].splitlines()[2:]
    documented = {}
    for row in table:
        status, meaning = (cell.strip() for cell in row.strip("|").split(" | ", 1))
        documented[status] = " ".join(meaning.replace("`", "").replace("\\|", "|").split())
    helped: dict[str, str] = {}
    for line in EXIT_STATUS_HELP.splitlines()[1:]:
        match = re.match(r"  (\d+)\s+(.*)", line)
        if match:
            status = match.group(1)
            helped[status] = match.group(2)
        else:
            helped[status] += " " + line.strip()
    assert helped == documented


@pytest.mark.parametrize(
    ("module", "arguments", "hint"),
    [
        ("gym_failures.demo", ["--bogus"], "-m gym_failures.demo --help"),
        ("gym_failures.demo", ["--rollouts", "x"], "-m gym_failures.demo --help"),
        ("gym_failures.cli", ["demo", "--bogus"], "-m gym_failures.cli demo --help"),
    ],
)
def test_a_usage_error_points_at_the_help_of_the_command_as_it_was_typed(
    module: str, arguments: list[str], hint: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, *arguments], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert (done.returncode, done.stdout) == (EXIT_USAGE, "")
    assert done.stderr.startswith("gym-failures demo: error: ")
    assert done.stderr.endswith(f"{hint}`)\n")
    assert "Traceback" not in done.stderr
