"""Sim fidelity against the live executor (``kvrl-fidelity``, docs/fidelity.md):
:mod:`~kvrl.fidelity.compare` (metrics, targets, errors), :mod:`~kvrl.fidelity.replay` (the live
run step by step and its replay through the sim's cost model), :mod:`~kvrl.fidelity.pairs` (one
workload x policy pair, live and sim, and its configuration), :mod:`~kvrl.fidelity.report`
(plots and the report)."""
