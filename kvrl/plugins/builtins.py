"""Imports every built-in plugin module so their ``@register`` decorators run."""
from kvrl.plugins import agent, defences, evictions, prefix_caches, schedulers, watermarks  # noqa: F401
