"""`gym_failures._loop.run`: uvloop's event loop when uvloop is installed, asyncio's otherwise."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from gym_failures import _loop


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


class _FakeLoop(asyncio.SelectorEventLoop):
    """Stands for uvloop's loop: a real loop, of a type of its own."""


def _fake_uvloop(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    made: list[int] = []

    def new_event_loop() -> asyncio.AbstractEventLoop:
        made.append(1)
        return _FakeLoop()

    module = types.ModuleType("uvloop")
    module.new_event_loop = new_event_loop  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "uvloop", module)
    return made


def test_the_loop_is_uvloops_when_uvloop_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _fake_uvloop(monkeypatch)
    monkeypatch.delenv(_loop.LOOP_ENV, raising=False)
    assert _loop.run(_loop_type()) is _FakeLoop
    assert made == [1]


def test_the_loop_is_asyncios_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    assert _loop.loop_factory() is None
    default = asyncio.new_event_loop()
    default.close()
    assert _loop.run(_loop_type()) is type(default)


@pytest.mark.parametrize("value", ["asyncio", " AsyncIO "])
def test_the_environment_keeps_asyncios_loop(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    made = _fake_uvloop(monkeypatch)
    monkeypatch.setenv(_loop.LOOP_ENV, value)
    assert _loop.run(_loop_type()) is not _FakeLoop
    assert made == []


def test_another_value_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _fake_uvloop(monkeypatch)
    monkeypatch.setenv(_loop.LOOP_ENV, "uvloop")
    assert _loop.run(_loop_type()) is _FakeLoop
    assert made == [1]


def test_run_returns_and_raises_as_asyncio_run_does() -> None:
    async def fail() -> None:
        raise LookupError("from the coroutine")

    with pytest.raises(LookupError, match="from the coroutine"):
        _loop.run(fail())
