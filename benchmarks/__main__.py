"""Run every benchmark and print its figures (`make bench`).

Every `benchmarks/bench_*.py` module with a `main()` is run in name order. `main()` prints its own
table or returns it as a string (printed here unless `main()` already printed it). `python -m
benchmarks header stream` runs only the named ones. Modules are found by glob, so a new benchmark
needs no change here.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from pathlib import Path
from typing import TextIO


class _Tee(io.TextIOBase):
    """Writes through to `stream` and keeps a copy, so a table printed by `main()` is not repeated."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()


def _modules(selected: list[str]) -> list[str]:
    stems = sorted(path.stem for path in Path(__file__).parent.glob("bench_*.py"))
    if not selected:
        return stems
    wanted = {name if name.startswith("bench_") else f"bench_{name}" for name in selected}
    unknown = wanted.difference(stems)
    if unknown:
        raise SystemExit(f"no such benchmark: {', '.join(sorted(unknown))} (have: {', '.join(stems)})")
    return [stem for stem in stems if stem in wanted]


def main(argv: list[str]) -> int:
    for stem in _modules(argv):
        module = importlib.import_module(f"{__package__ or 'benchmarks'}.{stem}")
        run = getattr(module, "main", None)
        if not callable(run):
            continue
        print(f"## {stem}\n", flush=True)
        tee = _Tee(sys.stdout)
        with contextlib.redirect_stdout(tee):
            result = run()
        if isinstance(result, str) and result.strip() not in tee.copy.getvalue():
            print(result)
        print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
