"""Run a command with cores kept busy by other processes, as on CI's busy machine (issue 33).

`python -m tests.load [--busy N] -- COMMAND ARGS...` starts N processes that spin (`while True: pass`),
each pinned to one core (the last N of the cores this process may use, as `taskset` would), runs
COMMAND unpinned beside them, stops them when it ends, and exits with its status. `make test-loaded`
runs the Ray and subprocess tests so, with one of the machine's cores busy (N=1).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

SPIN = "while True: pass"


def busy_cores(count: int) -> list[int]:
    """The cores the spinners are pinned to: the last `count` this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    if not 0 < count < len(allowed):
        raise SystemExit(f"--busy must be from 1 to {len(allowed) - 1} here (cores allowed: {allowed})")
    return allowed[-count:]


def spin(core: int) -> subprocess.Popen[bytes]:
    """A process that keeps `core` busy until it is killed."""
    process = subprocess.Popen([sys.executable, "-c", SPIN])
    os.sched_setaffinity(process.pid, {core})
    return process


def _exit_on(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.load", description="Run a command with cores kept busy."
    )
    parser.add_argument("--busy", type=int, default=1, help="cores to keep busy (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("no command given (python -m tests.load -- pytest ...)")
    cores = busy_cores(options.busy)
    # Killed (pkill, a job's end), it stops its spinners too: they would spin on, orphaned.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on)
    spinners = [spin(core) for core in cores]
    try:
        shown = ", ".join(
            f"pid {process.pid} on core {core}" for process, core in zip(spinners, cores, strict=True)
        )
        print(f"tests.load: cores kept busy: {shown}", file=sys.stderr, flush=True)
        return subprocess.call(command)
    finally:
        for process in spinners:
            process.kill()
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
