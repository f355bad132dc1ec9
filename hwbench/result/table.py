"""The results table: every result under some paths as one pandas DataFrame, a row per run,
fields flattened with dots (`spec.model`, `metrics.tokens_per_s`), its file in `path`. What
`hwbench.load_results` returns and what `hwbench export parquet|csv` writes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from hwbench.result.model import RunResult


def frame_of(found: list[tuple[RunResult, Path]]):
    """The table of (result, file) pairs."""
    import pandas as pd

    rows = [{"path": str(path), **result.to_dict()} for result, path in found]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return pd.json_normalize(rows, max_level=3) if rows else pd.DataFrame()


def flat_frame(frame):
    """``frame`` with every list or mapping cell (steps, ranks, nodes, ...) as JSON text, so
    that a column holds one kind of value (what Parquet and CSV need)."""
    flat = frame.copy()
    for column in flat.columns:
        if flat[column].map(lambda cell: isinstance(cell, (list, dict))).any():
            flat[column] = flat[column].map(_json_cell)
    return flat


def _json_cell(cell: Any) -> Any:
    return json.dumps(cell, sort_keys=True, default=str) if isinstance(cell, (list, dict)) else cell
