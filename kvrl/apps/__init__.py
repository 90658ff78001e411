"""The command-line apps (Hydra). Importing the package registers the config resolvers
(``${kvrl.stamp:}``, ``${kvrl.trace_cap:...}``; kvrl/apps/resolvers.py) before any app composes."""
from kvrl.apps.resolvers import register as _register_resolvers

_register_resolvers()
