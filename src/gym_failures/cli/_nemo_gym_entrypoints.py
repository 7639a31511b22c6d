"""The work of `gym-failures nemo-gym entrypoints`: NeMo Gym's bundled servers, instrumented, as
NeMo Gym's own launcher (`gym env start`) starts them.

The launcher (NeMo Gym 0.7.0, nemo_gym/cli/env.py `RunHelper.start`) starts every config instance
`<instance>: <server type>: <server dir>: {entrypoint: app.py, ...}` as `python app.py` in the
server's directory, which it looks up by `<server type>/<server dir>` in `--search-dir` roots first,
then the current directory, then NeMo Gym's install (a directory counts when it has a
`requirements.txt` or a `pyproject.toml`). Each server runs the `.venv` at
`<uv_venv_dir>/<server type>/<server dir>/.venv`; with `skip_venv_if_present` set, a `.venv` with a
`bin/python` and a `bin/activate` is used as it is and nothing is installed (without it, `uv` builds
one). So, per bundled server the configs name, under `OUT/<server type>/<server dir>/`:

    app.py            (the config's entrypoint) imports the bundled class and runs
                      `instrument(TheClass).run_webserver()`
    requirements.txt  how the launcher recognises the directory; what it would install without
                      `skip_venv_if_present`: the bundled server's requirements and gym-failures
    .venv             a link to NeMo Gym's venv (the one `--venv` names), where gym-failures is installed

and `gym env start --search-dir OUT +uv_venv_dir=OUT +skip_venv_if_present=true` runs them.

Decisions:
- The class is read from the bundled entrypoint's `if __name__ == "__main__": X.run_webserver()`
  with `ast`: nothing of NeMo Gym is imported here (this process need not have it), and that line
  is how the launcher itself would start the server.
- The configs are read as YAML (the `nemo-gym` extra: PyYAML) for their server instances only; the
  launcher resolves interpolation, inheritance and overrides when it runs. An instance that names no
  `entrypoint` of its own (it inherits one) is covered by the instance it inherits from.
- A server that is not bundled with NeMo Gym (your own, in the current directory) is left to the
  launcher: its class is yours to decorate with `@instrument`.
- Every file written starts with `MARK`, so a second run rewrites its own files and refuses any
  other (nothing is written then).
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gym_failures.cli._exits import CommandError

__all__ = [
    "MARK",
    "SERVER_TYPES",
    "Entrypoint",
    "NemoGymInstall",
    "Server",
    "entrypoint_of",
    "find_install",
    "launch_command",
    "read_servers",
    "server_class",
    "write_entrypoints",
]

SERVER_TYPES = ("responses_api_agents", "responses_api_models", "resources_servers", "environment_servers")
"""NeMo Gym 0.7.0's server types (nemo_gym/global_config.py:2142), the config keys under an instance."""

MARK = "# Written by `gym-failures nemo-gym entrypoints`"
"""The first line of every file written: a file without it is not ours to overwrite."""

_PROBE = """
import importlib.util, json
def where(name):
    spec = importlib.util.find_spec(name)
    return None if spec is None else list(spec.submodule_search_locations or [])
print(json.dumps({"nemo_gym": where("nemo_gym"), "gym_failures": where("gym_failures")}))
"""


@dataclass(frozen=True)
class NemoGymInstall:
    """NeMo Gym's venv (its `bin/python` runs the servers) and its install root, where `nemo_gym/`
    and the bundled server directories (`responses_api_agents/`, ...) are."""

    venv: Path
    root: Path

    @property
    def gym(self) -> str:
        """The launcher's command: the venv's `bin/gym`, or `gym` from PATH when the venv has none."""
        launcher = self.venv / "bin" / "gym"
        return str(launcher) if launcher.exists() else "gym"


@dataclass(frozen=True)
class Server:
    """A server directory the configs name (`responses_api_agents/simple_agent`) and its entrypoint."""

    server_type: str
    name: str
    entrypoint: str

    @property
    def path(self) -> str:
        return f"{self.server_type}/{self.name}"


@dataclass(frozen=True)
class Entrypoint:
    """What a bundled server's shadow entrypoint imports: `from module import class_name`."""

    server: Server
    module: str
    class_name: str
    requirements: tuple[str, ...]


def find_install(venv: Path | None) -> NemoGymInstall:
    """NeMo Gym's venv `venv`, or this interpreter's when it has NeMo Gym and `venv` is None; where
    NeMo Gym is installed there. Refused (exit 2) when it has no NeMo Gym or no gym-failures."""
    if venv is None:
        import importlib.util

        if importlib.util.find_spec("nemo_gym") is None:
            raise CommandError("NeMo Gym is not installed here: name its venv with --venv")
        venv = Path(sys.prefix)
    venv = venv.absolute()
    python = venv / "bin" / "python"
    if not python.exists():
        raise CommandError(f"{venv} is not a venv (it has no bin/python)")
    completed = subprocess.run(
        [str(python), "-c", _PROBE], capture_output=True, text=True, check=False, cwd=venv
    )
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise CommandError(f"{python} could not be run: {last}")
    found: dict[str, list[str] | None] = json.loads(completed.stdout)
    nemo_gym = found["nemo_gym"]
    if not nemo_gym:
        raise CommandError(f"{venv} has no NeMo Gym (nemo_gym is not importable there)")
    if not found["gym_failures"]:
        raise CommandError(
            f"gym-failures is not installed in {venv}, where the servers run: "
            f"{python} -m pip install gym-failures"
        )
    return NemoGymInstall(venv=venv, root=Path(nemo_gym[0]).parent)


def _config_file(config: str, install: NemoGymInstall) -> Path:
    """Where the launcher finds `config`: as given when absolute, else under the current directory,
    else under NeMo Gym's install (the bundled `responses_api_agents/.../configs/...yaml`)."""
    path = Path(config)
    for candidate in (path,) if path.is_absolute() else (path, install.root / path):
        if candidate.is_file():
            return candidate
    raise CommandError(f"{config}: no such config (nor under NeMo Gym's install, {install.root})")


def _load(config: str, path: Path) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise CommandError(f"{config}: not YAML{line}: {getattr(error, 'problem', None) or error}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{config}: not YAML (not UTF-8 text)") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise CommandError(f"{config}: not a NeMo Gym config (a mapping of server instances)")
    return loaded


def _instances(config: str, loaded: dict[str, Any]) -> Iterator[Server]:
    """The servers `loaded`'s instances start: each instance's server type, its server directory and
    its entrypoint (instances naming none inherit one and are skipped)."""
    for instance, body in loaded.items():
        if not isinstance(body, dict):
            continue
        server_type = next((key for key in body if key in SERVER_TYPES), None)
        if server_type is None:
            continue
        servers = body[server_type]
        if not isinstance(servers, dict) or not servers:
            raise CommandError(f"{config}: {instance}.{server_type} does not name a server directory")
        name, settings = next(iter(servers.items()))
        entrypoint = settings.get("entrypoint") if isinstance(settings, dict) else None
        if entrypoint is None:
            continue
        relative = PurePosixPath(str(entrypoint))
        if not isinstance(entrypoint, str) or relative.is_absolute() or ".." in relative.parts:
            raise CommandError(f"{config}: {instance}'s entrypoint {entrypoint!r} is not a relative path")
        if relative.suffix != ".py":
            raise CommandError(f"{config}: {instance}'s entrypoint {entrypoint!r} is not a Python file")
        yield Server(server_type=server_type, name=str(name), entrypoint=str(relative))


def read_servers(configs: Sequence[str], install: NemoGymInstall) -> list[Server]:
    """Every server the configs (and the configs their `config_paths` name) start, in order, once."""
    queue = list(configs)
    servers: dict[Server, None] = {}
    for config in queue:  # grows as configs name more
        loaded = _load(config, _config_file(config, install))
        nested = loaded.get("config_paths") or []
        if not isinstance(nested, list) or not all(isinstance(item, str) for item in nested):
            raise CommandError(f"{config}: config_paths is not a list of paths")
        queue.extend(item for item in nested if item not in queue)
        servers.update(dict.fromkeys(_instances(config, loaded)))
    if not servers:
        raise CommandError(f"no server instance with an entrypoint in {', '.join(configs)}")
    return list(servers)


def server_class(source: str, where: str) -> str:
    """The class a server entrypoint runs: `X` of its `if __name__ == "__main__": X.run_webserver()`."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise CommandError(f"{where}: not Python (line {error.lineno})") from None
    for node in tree.body:
        if not (isinstance(node, ast.If) and _is_main_test(node.test)):
            continue
        for statement in node.body:
            call = getattr(statement, "value", None)
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "run_webserver"
                and isinstance(call.func.value, ast.Name)
            ):
                return call.func.value.id
    raise CommandError(
        f'{where}: no `<class>.run_webserver()` under `if __name__ == "__main__":` to instrument'
    )


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side.id for side in sides if isinstance(side, ast.Name)]
    constants = [side.value for side in sides if isinstance(side, ast.Constant)]
    return names == ["__name__"] and constants == ["__main__"]


def entrypoint_of(server: Server, install: NemoGymInstall) -> Entrypoint | None:
    """What the shadow of `server` imports, or None when NeMo Gym bundles no such server directory."""
    directory = install.root / server.server_type / server.name
    if not directory.is_dir():
        return None
    source = directory / server.entrypoint
    if not source.is_file():
        raise CommandError(f"{server.path}: NeMo Gym's server has no entrypoint {server.entrypoint}")
    class_name = server_class(source.read_text(encoding="utf-8"), str(source))
    requirements_file = directory / "requirements.txt"
    requirements = (
        tuple(
            line.strip()
            for line in requirements_file.read_text(encoding="utf-8").splitlines()
            # `-e nemo-gym[dev] @ ../../` names NeMo Gym's checkout relative to the bundled directory:
            # the launcher installs NeMo Gym's own version in its place (nemo_gym/cli/setup_command.py).
            if line.strip() and not line.lstrip().startswith("#") and "../" not in line
        )
        if requirements_file.is_file()
        else ()
    )
    module = ".".join(
        [server.server_type, server.name, *PurePosixPath(server.entrypoint).with_suffix("").parts]
    )
    return Entrypoint(server=server, module=module, class_name=class_name, requirements=requirements)


def _app(entrypoint: Entrypoint) -> str:
    return (
        f"{MARK}: NeMo Gym's bundled {entrypoint.server.path}\n"
        f"# ({entrypoint.module}), its server class instrumented (gym_failures.nemo_gym_server.instrument).\n"
        "from gym_failures.nemo_gym_server import instrument\n"
        f"from {entrypoint.module} import {entrypoint.class_name}\n"
        "\n"
        'if __name__ == "__main__":\n'
        f"    instrument({entrypoint.class_name}).run_webserver()\n"
    )


def _requirements(entrypoint: Entrypoint) -> str:
    lines = [
        f"{MARK}: the launcher finds a server directory by this file.",
        "# With +skip_venv_if_present=true it runs the linked .venv and installs nothing; without it, these:",
        *entrypoint.requirements,
        "gym-failures",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _Planned:
    path: Path
    text: str | None = None
    link: Path | None = None

    def state(self) -> str:
        """`new`, `same` (ours, unchanged), `ours` (ours, to rewrite) or `foreign`."""
        if self.link is not None:
            if self.path.is_symlink():
                return "same" if Path(os.readlink(self.path)) == self.link else "foreign"
            return "foreign" if self.path.exists() else "new"
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            return "foreign"
        if not self.path.exists():
            return "new"
        try:
            current = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            return "foreign"
        if not current.startswith(MARK):
            return "foreign"
        return "same" if current == self.text else "ours"


def _plan(out: Path, entrypoints: Sequence[Entrypoint], install: NemoGymInstall) -> list[_Planned]:
    planned: list[_Planned] = []
    for entrypoint in entrypoints:
        directory = out / entrypoint.server.server_type / entrypoint.server.name
        planned.append(_Planned(directory / entrypoint.server.entrypoint, text=_app(entrypoint)))
        planned.append(_Planned(directory / "requirements.txt", text=_requirements(entrypoint)))
        planned.append(_Planned(directory / ".venv", link=install.venv))
    return list({item.path: item for item in planned}.values())


def write_entrypoints(out: Path, entrypoints: Sequence[Entrypoint], install: NemoGymInstall) -> int:
    """Write every shadow directory under `out`; the number of files written or changed (0: all were
    there already). Refused, with nothing written, when a file in the way is not one of ours."""
    planned = _plan(out, entrypoints, install)
    states = [(item, item.state()) for item in planned]
    foreign = [item.path for item, state in states if state == "foreign"]
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise CommandError(
            f"{foreign[0]}{more} was not written by gym-failures: not overwriting it (move it, or choose "
            "another --out)"
        )
    written = 0
    for item, state in states:
        if state == "same":
            continue
        item.path.parent.mkdir(parents=True, exist_ok=True)
        if item.link is not None:
            item.path.symlink_to(item.link, target_is_directory=True)
        else:
            assert item.text is not None
            item.path.write_text(item.text, encoding="utf-8")
        written += 1
    return written


def launch_command(install: NemoGymInstall, out: Path, configs: Sequence[str]) -> str:
    """The `gym env start` that runs the configs with the shadow directories under `out`: configs
    found under the current directory by absolute path, bundled ones as the launcher names them."""
    paths = [str(Path(config).absolute()) if Path(config).is_file() else config for config in configs]
    words = [
        install.gym,
        "env",
        "start",
        "--search-dir",
        str(out.absolute()),
        f"+config_paths=[{','.join(paths)}]",
        "+skip_venv_if_present=true",
        f"+uv_venv_dir={out.absolute()}",
    ]
    return shlex.join(words)
