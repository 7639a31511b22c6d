"""One collector per output: the run's exclusive lock on `<output>.lock`.

A run holds an exclusive `flock` on `<output>.lock` from start to end, and a second collector on the
same output is refused at once with `collection_resume_refused` (which `force_resume` does not
override); the refusal names the process that holds it. The lock file stays after the run; removing it
could let two runs lock two different files. `flock` is POSIX: collection runs on Linux and macOS.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from gym_failures.collection._config import CollectionConfig
from gym_failures.failure_kinds import COLLECTION_RESUME_REFUSED
from gym_failures.failures import CollectionFailure


@contextlib.contextmanager
def exclusive(config: CollectionConfig) -> Iterator[None]:
    """Hold the output's lock for the block, or refuse at once when another collector holds it."""
    path = config.lock_path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            who = f"process {holder}" if holder.isdigit() else "it"
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"another collector is writing {config.output_path} ({who} holds {path}); "
                    "wait for it to end, or collect into another output path"
                ),
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock
