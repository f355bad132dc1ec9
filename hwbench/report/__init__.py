"""Turning results into tables people read (docs/reports.md). `write_report` is what
`hwbench report` and hwbench.write_report both call."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

FORMATS = ("md", "html", "csv", "json")


def write_report(paths: Sequence[str], format: str = "md", against: str | os.PathLike | None = None,
                 prices: Mapping[str, Any] | None = None, tokens: float | None = None, projection_devices: int = 8,
                 out: str | os.PathLike | None = None,
                 also_formula: str | None = None, references: Sequence[str] = (),
                 keep_different: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """The report over the result files under ``paths`` as text in ``format``, written
    atomically to ``out`` when given (never half-written, never over one of its inputs),
    and the (file, reason) of each file left out. ``also_formula``: a FLOPs formula whose MFU
    the per-model tables show beside the default's. ``references``: result files of runs to check
    each result against (docs/parity.md); a result that fails is "numerically different" and left
    out of the comparisons unless ``keep_different``. UsageError, one line, for bad input."""
    from hwbench.errors import UsageError
    from hwbench.files import write_text_atomic
    from hwbench.paths import check_output_file
    from hwbench.report.build import make_report

    if format not in FORMATS:
        raise UsageError(f"--format {format!r} is not accepted; give {', '.join(FORMATS[:-1])} or {FORMATS[-1]}")
    if also_formula is not None:
        from hwbench.workload.flops import FLOPS_FORMULA_NAMES, canonical_formula

        try:
            also_formula = canonical_formula(also_formula)
        except ValueError:
            raise UsageError(f"--also-formula {also_formula!r} is not known; accepted: "
                             f"{', '.join(FLOPS_FORMULA_NAMES)}") from None
    if out is not None:
        check_output_file(out, "--out", paths)
    text, skipped = make_report(list(paths), format, None if against is None else os.fspath(against), prices or {},
                                tokens, projection_devices, also_formula, list(references), keep_different)
    if out is not None:
        try:
            write_text_atomic(out, text)
        except OSError as error:
            raise UsageError(f"--out {os.fspath(out)}: cannot be written: {error.strerror}") from None
    return text, skipped
