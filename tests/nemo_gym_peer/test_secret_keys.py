"""Which config values a NeMo Gym server registers as secrets, beside NeMo Gym's own rule for a
secret key (nemo_gym/secret_utils.py:24 `looks_like_secret_key`, a substring test): the keys that
hold credentials are secret to both; the keys NeMo Gym's substring test catches only by accident
(`tokenizer_model`, `output_token_policy`, `max_tokens`) hold model names and settings, which
gym-failures never registers: they would be cut out of every failure text."""

from __future__ import annotations

import json
from pathlib import Path

from tests.nemo_gym_peer.peer_process import run_peer

CONFIG = {
    "policy_api_key": "sk-policy-0123456789abcdef",
    "judge_api_key": "judge-key-0123456789",
    "openai_default_headers": {"Authorization": "Bearer header-token-abcdef"},
    "access_token": "tok-0123456789abcdef",
    "tokenizer_model": "gpt-4o",
    "output_token_policy": "remaining_context",
    "max_tokens": "4096-tokens",
    "author": "nvidia_team",
    "judge_model": "gpt-4o-mini",
}


def test_credentials_are_secret_to_both_and_model_names_to_neither_here(tmp_path: Path) -> None:
    peer = run_peer("secret_keys", json.dumps(CONFIG), cwd=tmp_path)
    # NeMo Gym's own rule calls these secret (and masks them when it prints a config) ...
    assert peer["nemo_gym_secret_keys"] == [
        "access_token",
        "judge_api_key",
        "max_tokens",
        "openai_default_headers",
        "output_token_policy",
        "policy_api_key",
        "tokenizer_model",
    ]
    assert peer["nemo_gym_masked"]["tokenizer_model"] == "****"
    # ... gym-failures registers the credentials among them, never a model name or a setting.
    assert set(peer["registered"]) == {
        "sk-policy-0123456789abcdef",
        "judge-key-0123456789",
        "Bearer header-token-abcdef",
        "header-token-abcdef",
        "tok-0123456789abcdef",
    }
