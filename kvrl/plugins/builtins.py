"""Imports every built-in plugin module so their ``@register`` decorators run."""
from kvrl.plugins import (agent, controllers, defences, evictions, joint, prefix_caches, schedulers,  # noqa: F401
                          swap_prefetch, tiers, watermarks)
