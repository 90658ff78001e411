"""Isolation experiments against the engine (``kvrl-attack``, docs/security.md), one module each:
:mod:`~kvrl.attacks.prefix_probe`, :mod:`~kvrl.attacks.fill_squeeze`,
:mod:`~kvrl.attacks.benign_cost`; with the attackers' statistics (:mod:`~kvrl.attacks.scoring`),
the XXH3 block forger (:mod:`~kvrl.attacks.forge`), the options and presets
(:mod:`~kvrl.attacks.config`) and what they share (:mod:`~kvrl.attacks.common`)."""
