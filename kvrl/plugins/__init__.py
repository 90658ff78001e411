"""Policy plugins: one registry for the kinds ``scheduler``, ``watermark``, ``eviction`` and
``prefix_cache``. See :mod:`kvrl.plugins.registry` for the contract and :mod:`kvrl.plugins.base`
for each kind's interface."""
from kvrl.plugins.base import (EvictionDecision, EvictionPolicy, Policy, PreemptionMode, PrefixCachePolicy,
                               SchedulerPolicy, WatermarkPolicy, check_choice, check_range)
from kvrl.plugins.registry import (KINDS, UnknownPluginError, available, create, create_from_config,
                                   get_spec, load_entry_points, make_params, register)

__all__ = [
    "KINDS", "UnknownPluginError", "available", "create", "create_from_config", "get_spec", "load_entry_points",
    "make_params", "register", "Policy", "SchedulerPolicy", "WatermarkPolicy", "EvictionPolicy",
    "PrefixCachePolicy", "EvictionDecision", "PreemptionMode", "check_range", "check_choice",
]
