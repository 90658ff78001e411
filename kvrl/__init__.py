"""kvrl: KV-cache memory management research framework."""
__version__ = "0.1.0"

import kvrl.envs  # noqa: E402,F401  (registers the Gymnasium environments; imports only gymnasium)
