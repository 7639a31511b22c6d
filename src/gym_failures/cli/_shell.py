"""How to name this program and a path for a user to paste into a shell (`program`, `shell_path`):
the hints of the errors and the demo's next steps print them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["demo_module", "program", "shell_path"]


def program() -> str:
    """How to run this command line again, as it was run: `gym-failures` when that name on PATH is
    this program, else its path (`.venv/bin/gym-failures` after `make demo`), else
    `python -m gym_failures.cli`."""
    import shutil  # 10 ms of start-up: only a hint or an error needs it

    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "gym-failures"
    name = Path(argv0).name
    if name in ("__main__.py", "-c") or not Path(argv0).exists():
        return (
            "gym-failures"
            if name == "gym-failures"
            else f"{shell_path(Path(sys.executable))} -m gym_failures.cli"
        )
    found = shutil.which(name)
    if found is not None and Path(found).resolve() == Path(argv0).resolve():
        return name
    return shell_path(Path(argv0))


def demo_module() -> str | None:
    """`python -m gym_failures.demo` (its Python as a shell word) when that is how this process
    was run, the `demo` command implied; else None."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is None or argv0.name != "__main__.py" or argv0.parent.name != "demo":
        return None
    return f"{shell_path(Path(sys.executable))} -m gym_failures.demo"


def shell_path(path: Path) -> str:
    """`path` as a shell word to paste: relative to the working directory when under it, quoted."""
    import shlex

    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        relative = str(path)
    shown = relative if not relative.startswith("..") else str(path.absolute())
    return shlex.quote(shown)
