"""The results table (hwbench.result.table: what hwbench.load_results returns) as Parquet
(pyarrow, the `parquet` extra) or CSV, for notebooks and warehouses: a row per run, columns
named with dots (`spec.model`, `metrics.tokens_per_s`), lists and mappings as JSON text."""

from __future__ import annotations

import io


def render(fmt: str, runs: list, files: list, request) -> str | bytes:
    frame = table_of(runs, files)
    if fmt == "csv":
        return frame.to_csv(index=False)
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False, engine="pyarrow")
    return buffer.getvalue()


def table_of(runs: list, files: list):
    """The runs' table as hwbench.load_results builds it, its list and mapping cells as JSON."""
    from hwbench.result.table import flat_frame, frame_of

    return flat_frame(frame_of(list(zip(runs, files))))
