"""Which NeMo Gym and which Python the peer runs."""

import sys
from importlib.metadata import version

import nemo_gym.rollout_outcomes  # noqa: F401  (imports, or the peer venv is broken)
from _peer import report

report({"nemo_gym": version("nemo-gym"), "python": list(sys.version_info[:2])})
