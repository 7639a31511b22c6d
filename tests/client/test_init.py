"""Tests for the package surface: importing it loads no HTTP library, and the library types load lazily."""

from __future__ import annotations

import subprocess
import sys

import aiohttp
import httpx
import httpx2
import pytest

import gym_failures.client
from gym_failures.failures import exception_type_name


def run_fresh(code: str) -> str:
    """`code` run by a fresh interpreter, which has imported nothing yet; its standard output."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


HTTP_MODULES = (
    "aiohttp",
    "httpx",
    "httpx2",
    "gym_failures.client._aiohttp",
    "gym_failures.client._httpx",
    "gym_failures.client._httpx2",
)


def http_modules_loaded_by(code: str) -> list[str]:
    """Which of `HTTP_MODULES` a fresh interpreter has loaded after running `code`."""
    report = f"import sys; print(','.join(m for m in {HTTP_MODULES!r} if m in sys.modules))"
    return [name for name in run_fresh(f"{code}\n{report}").split(",") if name]


def test_importing_the_package_imports_no_http_library() -> None:
    assert http_modules_loaded_by("import gym_failures.client") == []


def test_an_httpx_reply_loads_httpx_s_module_and_not_aiohttp() -> None:
    code = (
        "import asyncio, httpx\n"
        "from gym_failures.client import raise_boundary_failure\n"
        "reply = httpx.Response(200, request=httpx.Request('GET', 'http://model.test/'))\n"
        "asyncio.run(raise_boundary_failure(reply))"
    )

    assert http_modules_loaded_by(code) == ["httpx", "gym_failures.client._httpx"]


def test_an_httpx2_reply_and_error_need_neither_httpx_nor_aiohttp() -> None:
    """The official SDKs bring httpx2 alone: with httpx and aiohttp not installed, an httpx2 reply is
    read and an httpx2 transport error mapped."""
    code = (
        "import asyncio, sys\n"
        "sys.modules['aiohttp'] = sys.modules['httpx'] = None\n"
        "import httpx2\n"
        "from gym_failures.client import map_transport_errors, raise_boundary_failure\n"
        "reply = httpx2.Response(200, request=httpx2.Request('GET', 'http://model.test/'))\n"
        "asyncio.run(raise_boundary_failure(reply))\n"
        "try:\n"
        "    with map_transport_errors('model'):\n"
        "        raise httpx2.ConnectError('refused')\n"
        "except Exception as error:\n"
        "    print(error.failure_kind, error.http_details.delivery)\n"
        "print(','.join(m for m in sys.modules if m.startswith('gym_failures.client._')))"
    )

    kind, loaded = run_fresh(code).splitlines()
    assert kind == "transport_unreachable not_sent"
    assert "gym_failures.client._httpx2" in loaded.split(",")
    assert "gym_failures.client._httpx" not in loaded.split(",")


def test_star_import_works_without_either_library_installed() -> None:
    """A `None` in `sys.modules` makes importing that name fail as if it were not installed."""
    code = (
        "import sys\n"
        "sys.modules['aiohttp'] = sys.modules['httpx'] = None\n"
        "from gym_failures.client import *\n"
        "print(sorted(name for name in dir() if not name.startswith('_') and name != 'sys'))"
    )

    assert run_fresh(code) == str(sorted(gym_failures.client.__all__))


def test_a_library_error_type_needs_its_library() -> None:
    code = (
        "import sys\n"
        "sys.modules['aiohttp'] = None\n"
        "try:\n"
        "    from gym_failures.client import GymClientResponseError\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__, error.name)\n"
    )

    assert run_fresh(code) == "ModuleNotFoundError aiohttp"


def test_the_library_error_types_are_the_libraries_own() -> None:
    from gym_failures.client import GymClientResponseError, GymHTTPStatusError

    assert issubclass(GymClientResponseError, aiohttp.ClientResponseError)
    assert issubclass(GymHTTPStatusError, httpx.HTTPStatusError)
    assert issubclass(gym_failures.client.GymHttpx2StatusError, httpx2.HTTPStatusError)


def test_the_library_error_types_keep_their_public_type_names() -> None:
    """The name a failure records for an unhandled one (`exception_type`) is the one it had before."""
    from gym_failures.client import GymClientResponseError, GymHTTPStatusError

    assert exception_type_name(GymClientResponseError) == "gym_failures.client.GymClientResponseError"
    assert exception_type_name(GymHTTPStatusError) == "gym_failures.client.GymHTTPStatusError"
    assert (
        exception_type_name(gym_failures.client.GymHttpx2StatusError)
        == "gym_failures.client.GymHttpx2StatusError"
    )


def test_the_library_error_types_stay_out_of_all() -> None:
    assert "GymClientResponseError" not in gym_failures.client.__all__
    assert "GymHTTPStatusError" not in gym_failures.client.__all__
    assert "GymHttpx2StatusError" not in gym_failures.client.__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = gym_failures.client.nothing_here
