"""A pytest plugin's fixture whose extra is not installed fails the test at setup in one line that
names the extra (found by a fresh-clone trial: `proxy` with only `[pytest]` answered every forwarded
request 500, and `model_endpoint` without starlette raised a bare `ModuleNotFoundError`)."""

from __future__ import annotations

import pytest

from gym_failures._thread_server import require_extra

pytest_plugins = ["pytester"]

_HIDE = """
import importlib.util

import pytest

_real = importlib.util.find_spec


@pytest.fixture(autouse=True, scope="session")
def _hidden():
    def find_spec(name, *args):
        return None if name == "{module}" else _real(name, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(importlib.util, "find_spec", find_spec)
        yield
"""


def test_a_missing_module_is_one_line_naming_the_extra() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        require_extra("proxy", "pytest,proxy", ("no_such_module_for_gym_failures",))
    assert str(failed.value) == (
        "the proxy fixture needs the pytest and proxy extras (no_such_module_for_gym_failures is not "
        "installed): pip install 'gym-failures[pytest,proxy]'"
    )
    require_extra("proxy", "pytest,proxy", ("json",))  # installed: nothing happens


@pytest.mark.parametrize(
    ("fixture", "module", "line"),
    [
        (
            "proxy",
            "aiohttp",
            "the proxy fixture needs the pytest and proxy extras (aiohttp is not installed): "
            "pip install 'gym-failures[pytest,proxy]'",
        ),
        (
            "model_endpoint",
            "starlette",
            "the model_endpoint fixture needs the pytest extra (starlette is not installed): "
            "pip install 'gym-failures[pytest]'",
        ),
    ],
)
def test_each_fixture_fails_at_setup_naming_its_extra(
    pytester: pytest.Pytester, fixture: str, module: str, line: str
) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makeconftest(_HIDE.replace("{module}", module))
    pytester.makepyfile(f"def test_it({fixture}):\n    pass\n")
    result = pytester.runpytest("-p", "no:randomly", "-p", "no:xdist")
    result.assert_outcomes(errors=1)
    assert line in result.stdout.str().splitlines()  # (`[...]` would be a class to fnmatch)
    assert "ModuleNotFoundError" not in result.stdout.str()
