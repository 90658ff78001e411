"""Imports every built-in plugin module so their ``@register`` decorators run."""
from kvrl.plugins import (agent, controllers, defences, evictions, joint, orders, prefix_caches,  # noqa: F401
                          schedulers, scored, swap_prefetch, tiers, watermarks)
