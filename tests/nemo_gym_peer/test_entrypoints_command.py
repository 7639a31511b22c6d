"""`gym-failures nemo-gym entrypoints` over NeMo Gym 0.7.0's install: what it writes for the bundled
configs, that a second run changes nothing, and the one-line refusals (exit status 2) that write
nothing. `test_launcher.py` runs what it writes under `gym env start`."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.cli.invoke import run_cli
from tests.nemo_gym_peer.peer_process import NEMO_GYM_VENV, REPO

CONFIGS = (
    "responses_api_models/openai_model/configs/openai_model.yaml",
    "resources_servers/mcqa/configs/mcqa.yaml",
)
PREFIX = "gym-failures nemo-gym entrypoints: error: "


def _entrypoints(*args: str | Path) -> tuple[int, str, str]:
    return run_cli("nemo-gym", "entrypoints", *args, "--venv", NEMO_GYM_VENV)


def _files(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): (f"-> {path.readlink()}" if path.is_symlink() else path.read_text())
        for path in sorted(root.rglob("*"))
        if path.is_symlink() or path.is_file()
    }


def test_it_writes_an_instrumented_entrypoint_per_bundled_server(tmp_path: Path) -> None:
    code, stdout, stderr = _entrypoints(*CONFIGS, "--out", tmp_path / "out")
    assert code == 0, stderr
    files = _files(tmp_path / "out")
    servers = {
        "responses_api_models/openai_model": "SimpleModelServer",
        "resources_servers/mcqa": "MCQAResourcesServer",
        "responses_api_agents/simple_agent": "SimpleAgent",
        "environment_servers/legacy_agent": "LegacyAgentEnvironmentServer",
    }
    assert set(files) == {
        f"{server}/{name}" for server in servers for name in ("app.py", "requirements.txt", ".venv")
    }
    for server, class_name in servers.items():
        app = files[f"{server}/app.py"]
        assert f"from {server.replace('/', '.')}.app import {class_name}\n" in app
        assert f"    instrument({class_name}).run_webserver()\n" in app
        assert files[f"{server}/.venv"] == f"-> {NEMO_GYM_VENV}"
        assert files[f"{server}/requirements.txt"].splitlines()[-1] == "gym-failures"
        assert "../" not in files[f"{server}/requirements.txt"]
    assert "tiktoken" in files["resources_servers/mcqa/requirements.txt"]  # the bundled server's own
    out = str((tmp_path / "out").absolute())
    assert shlex.split(stdout) == [
        str(NEMO_GYM_VENV / "bin" / "gym"),
        "env",
        "start",
        "--search-dir",
        out,
        f"+config_paths=[{','.join(CONFIGS)}]",
        "+skip_venv_if_present=true",
        f"+uv_venv_dir={out}",
    ]


def test_a_second_run_changes_nothing_and_prints_the_same_command(tmp_path: Path) -> None:
    first = _entrypoints(*CONFIGS, "--out", tmp_path)
    stamps = {path: path.lstat().st_mtime_ns for path in tmp_path.rglob("*")}
    second = _entrypoints(*CONFIGS, "--out", tmp_path)
    assert (second[0], second[1]) == (0, first[1])
    assert "unchanged" in second[2]
    assert {path: path.lstat().st_mtime_ns for path in tmp_path.rglob("*")} == stamps


def test_it_rewrites_its_own_files_and_refuses_anyone_elses(tmp_path: Path) -> None:
    assert _entrypoints(CONFIGS[0], "--out", tmp_path)[0] == 0
    app = tmp_path / "responses_api_models" / "openai_model" / "app.py"
    app.write_text(app.read_text() + "# edited\n")
    assert _entrypoints(CONFIGS[0], "--out", tmp_path)[0] == 0
    assert "# edited" not in app.read_text()

    app.write_text("print('my own entrypoint')\n")
    code, stdout, stderr = _entrypoints(*CONFIGS, "--out", tmp_path)
    assert (code, stdout) == (2, "")
    refusal = "was not written by gym-failures: not overwriting it (move it, or choose another --out)"
    assert stderr.splitlines() == [f"{PREFIX}{app} {refusal}"]
    assert app.read_text() == "print('my own entrypoint')\n"
    assert not (tmp_path / "resources_servers").exists()  # nothing else written either


def test_a_server_not_bundled_is_left_to_the_launcher(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    own.write_text("my_server:\n  resources_servers:\n    my_own_server:\n      entrypoint: app.py\n")
    code, stdout, stderr = _entrypoints(CONFIGS[0], own, "--out", tmp_path / "out")
    assert code == 0, stderr
    assert "resources_servers/my_own_server: not bundled with NeMo Gym, left to the launcher" in stderr
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["responses_api_models"]
    assert f"+config_paths=[{CONFIGS[0]},{own}]" in shlex.split(stdout)

    code, _, stderr = _entrypoints(own, "--out", tmp_path / "out")
    assert (code, stderr) == (
        2,
        f"{PREFIX}none of the configs' servers is bundled with NeMo Gym: nothing to write\n",
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("a: [1,\n", "bad.yaml: not YAML (line 2): expected the node content, but found '<stream end>'"),
        ("- a\n- b\n", "bad.yaml: not a NeMo Gym config (a mapping of server instances)"),
        ("policy_base_url: http://127.0.0.1:1/v1\n", "no server instance with an entrypoint in bad.yaml"),
        ("x:\n  resources_servers: {}\n", "bad.yaml: x.resources_servers does not name a server directory"),
        ("x:\n  resources_servers:\n    mcqa:\n      entrypoint: /abs/app.py\n", "bad.yaml: x's entrypoint"),
        ("config_paths: nested.yaml\n", "bad.yaml: config_paths is not a list of paths"),
    ],
)
def test_a_bad_config_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, error: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text(text)
    code, stdout, stderr = _entrypoints("bad.yaml", "--out", "out")
    assert (code, stdout, len(stderr.splitlines())) == (2, "", 1), stderr
    assert stderr.startswith(f"{PREFIX}{error}")
    assert not Path("out").exists()


def test_a_missing_config_and_a_venv_without_nemo_gym_are_refused(tmp_path: Path) -> None:
    code, _, stderr = _entrypoints("nowhere.yaml", "--out", tmp_path)
    assert code == 2
    assert stderr.startswith(f"{PREFIX}nowhere.yaml: no such config (nor under NeMo Gym's install, ")

    code, _, stderr = run_cli(
        "nemo-gym", "entrypoints", CONFIGS[0], "--out", tmp_path, "--venv", REPO / ".venv"
    )
    assert (code, stderr) == (
        2,
        f"{PREFIX}{REPO / '.venv'} has no NeMo Gym (nemo_gym is not importable there)\n",
    )
    assert list(tmp_path.iterdir()) == []
