"""Shared by the peer scripts (run in NeMo Gym's venv only): reporting a result back to the test."""

from __future__ import annotations

import json
import os
from typing import Any


def report(result: Any) -> None:
    """Write `result` as JSON where the test reads it (`GF_PEER_RESULT`)."""
    with open(os.environ["GF_PEER_RESULT"], "w") as handle:
        json.dump(result, handle)
