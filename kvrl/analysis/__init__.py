"""Analysis of run results: the metric registry (names, labels, units, direction, range) and the
statistics every app reports with (t-intervals, paired comparisons with a verdict, Holm)."""
