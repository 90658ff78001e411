"""Measuring a live executor's step times for a step-time profile (``kvrl-profile``; the file
format and the fitted model are :mod:`kvrl.executors.profile`): :mod:`~kvrl.profiling.batches`
(the shapes timed), :mod:`~kvrl.profiling.timing` (timing them), :mod:`~kvrl.profiling.host`
(the engine run), :mod:`~kvrl.profiling.run` (a whole profile and its report)."""
