"""A project that installs gym-failures without a server's extras still runs pytest: pytest imports the
two plugins (`pytest11` entry points) in every run, so importing them, and their packages, needs none
of Starlette, uvicorn, aiohttp or the MCP SDK. Checked in a fresh interpreter where those are
unimportable."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

_BLOCKED = ("starlette", "uvicorn", "aiohttp", "mcp", "httpx", "openai", "anthropic", "duckdb", "rich")

_SCRIPT = f"""
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {_BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocked())
import gym_failures.model_endpoint.pytest_plugin
import gym_failures.proxy.pytest_plugin
import gym_failures.model_endpoint, gym_failures.proxy
print(sorted(name for name in sys.modules if name.partition(".")[0] in {_BLOCKED!r}))
"""


def test_the_pytest_plugins_import_without_the_servers_extras() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_name_of_the_package_loads_its_module_on_first_use() -> None:
    from gym_failures import model_endpoint, proxy

    assert model_endpoint.FAULTS["none"].startswith("no fault")
    assert "latency" in proxy.TOXICS
    assert set(dir(proxy)) >= set(proxy.__all__)
