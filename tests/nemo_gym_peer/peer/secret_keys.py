"""NeMo Gym's own secret-key rule (`nemo_gym.secret_utils.looks_like_secret_key`) and its config
masking (`recursively_hide_secrets`) beside the values gym-failures registers from the same config
(`gym_failures.nemo_gym_server.server_secrets`): argv[1] is the config, as JSON."""

import json
import sys

from _peer import report
from nemo_gym.secret_utils import looks_like_secret_key, recursively_hide_secrets
from omegaconf import OmegaConf

from gym_failures.nemo_gym_server import server_secrets

config = json.loads(sys.argv[1])
masked = OmegaConf.create(config)
recursively_hide_secrets(masked)


class _Server:
    """What `server_secrets` reads of a NeMo Gym server: its config, an OmegaConf config as NeMo Gym's."""

    def __init__(self) -> None:
        self.config = OmegaConf.create(config)


report(
    {
        "nemo_gym_secret_keys": sorted(key for key in config if looks_like_secret_key(key)),
        "nemo_gym_masked": OmegaConf.to_container(masked),
        "registered": server_secrets(_Server()),
    }
)
