"""Judging results: did performance change (compare), is a delivered system what it should be
(accept, against a baseline file), do two runs train to the same loss (parity), and the verdicts
as CI reads them (ci_output). Rendering is hwbench.report's; this package says what holds."""
