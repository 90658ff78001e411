"""kvrl: KV-cache memory management research framework.

``import kvrl`` imports nothing heavy (no Gymnasium, torch or engine). The Gymnasium ids
(``kvrl/Watermark-v0``, ...) are registered by ``import kvrl.envs``; ``gymnasium.make`` also finds
them without it through Gymnasium's ``module:id`` form, ``gymnasium.make("kvrl.envs:kvrl/Watermark-v0")``.
"""
__version__ = "0.1.0"
