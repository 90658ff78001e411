"""Imports every built-in plugin module so their ``@register`` decorators run."""
from kvrl.plugins import defences, evictions, prefix_caches, schedulers, watermarks  # noqa: F401
