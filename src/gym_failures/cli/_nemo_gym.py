"""`gym-failures nemo-gym`: commands for running gym-failures inside NeMo Gym's own tooling.

`nemo-gym entrypoints CONFIG... --out DIR [--venv VENV]` writes, for every server of NeMo Gym's
bundled ones that the configs name, an entrypoint that runs it instrumented
(`gym_failures.nemo_gym_server.instrument`) where NeMo Gym's launcher, `gym env start`, finds it
(`gym_failures.cli._nemo_gym_entrypoints` says how), and prints the `gym env start` command that
runs them: on stdout, alone, so that `$(gym-failures nemo-gym entrypoints ...)` is that command.
What it wrote goes to stderr.

Decisions:
- A command group (`nemo-gym entrypoints`), as `serve model` is: NeMo Gym's tooling is a family
  of its own, and each command's `--help` is its own page.
- The configs are named as `gym env start` names them (`responses_api_agents/simple_agent/configs/
  simple_agent.yaml` is the bundled one), and the printed command names them the same way.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from gym_failures.cli._exits import EXIT_OK, CommandError
from gym_failures.cli._options import Subcommands, add_command

__all__ = ["ENTRYPOINTS_EXIT_HELP", "add_nemo_gym"]

ENTRYPOINTS_EXIT_HELP = """exit status:
  0    the entrypoints are written (or were there already); the command that
       runs them is on stdout
  2    nothing written: a config that is missing or not NeMo Gym's, a venv
       without NeMo Gym or gym-failures, a file in the way that gym-failures
       did not write, an extra that is not installed (one line on stderr)"""


def add_nemo_gym(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "nemo-gym",
        _run_entrypoints,
        help="run gym-failures inside NeMo Gym's tooling (its launcher, gym env start)",
        description="Commands for NeMo Gym's own tooling: `nemo-gym entrypoints` writes entrypoints "
        "that run NeMo Gym's bundled servers instrumented under its launcher, `gym env start`.",
        extra="nemo-gym",
    )
    group = parser.add_subparsers(
        title="commands",
        metavar="{entrypoints}",
        dest="nemo_gym_command",
        parser_class=type(parser),
        required=True,
    )
    entrypoints = group.add_parser(
        "entrypoints",
        help="write instrumented entrypoints for the bundled servers that NeMo Gym configs name",
        description=textwrap.fill(
            "nemo-gym entrypoints: for every server bundled with NeMo Gym that the configs start "
            "(responses_api_agents/simple_agent, responses_api_models/openai_model, resources_servers/"
            "mcqa, ...), write DIR/<server type>/<server dir>/ with the config's entrypoint (app.py), "
            "which runs the bundled server class instrumented with gym_failures.nemo_gym_server."
            "instrument, a requirements.txt and a .venv link to NeMo Gym's venv; then print the "
            "`gym env start --search-dir DIR ...` command that runs them with NeMo Gym's launcher. "
            "Servers not bundled with NeMo Gym (your own) are left to the launcher. Running it again "
            "rewrites only its own files. Needs the nemo-gym extra (PyYAML).",
            88,
        ),
        epilog=ENTRYPOINTS_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    entrypoints.set_defaults(
        run=_run_entrypoints,
        extra="nemo-gym",
        command_name="nemo-gym entrypoints",
        counts_skipped_lines=False,
    )
    entrypoints.add_argument(
        "configs",
        nargs="+",
        metavar="CONFIG",
        help="NeMo Gym config files, as `gym env start` takes them in +config_paths (a path under the "
        "current directory or NeMo Gym's install)",
    )
    entrypoints.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="the directory to write the entrypoints under"
    )
    entrypoints.add_argument(
        "--venv",
        type=Path,
        default=None,
        metavar="VENV",
        help="NeMo Gym's venv, with gym-failures installed in it: the servers run there (default: this "
        "interpreter's, when it has NeMo Gym)",
    )


def _run_entrypoints(arguments: argparse.Namespace) -> int:
    from gym_failures.cli._nemo_gym_entrypoints import (
        entrypoint_of,
        find_install,
        launch_command,
        read_servers,
        write_entrypoints,
    )

    out: Path = arguments.out
    if out.exists() and not out.is_dir():
        raise CommandError(f"{out} is not a directory")
    install = find_install(arguments.venv)
    servers = read_servers(arguments.configs, install)
    entrypoints = []
    notes = []  # printed once everything is written: a refusal is its one line alone
    for server in servers:
        entrypoint = entrypoint_of(server, install)
        if entrypoint is None:
            notes.append(f"{server.path}: not bundled with NeMo Gym, left to the launcher")
            continue
        entrypoints.append(entrypoint)
        notes.append(
            f"{server.path}/{server.entrypoint}: instrument({entrypoint.class_name}) from {entrypoint.module}"
        )
    if not entrypoints:
        raise CommandError("none of the configs' servers is bundled with NeMo Gym: nothing to write")
    written = write_entrypoints(out, entrypoints, install)
    notes.append(f"{written} file(s) written under {out}" if written else f"{out}: unchanged, up to date")
    print("\n".join(notes), file=sys.stderr)
    print(launch_command(install, out, arguments.configs))
    return EXIT_OK
