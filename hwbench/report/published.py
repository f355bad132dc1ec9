"""The published tables (results/published/*.csv) as data.

One row per published point; the format is described in docs/reports.md and
results/published/README.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from hwbench.errors import UsageError

REQUIRED_COLUMNS = ("table", "name", "model", "params", "devices", "tp", "pp", "seq_length",
                    "ppl", "samples_per_s", "steps")
OPTIONAL_COLUMNS = ("device_class", "micro_batch_size", "global_batch_size", "precision", "recompute", "source")
BOOLEAN_COLUMNS = {"recompute": {"true": True, "false": False}}
NUMERIC_COLUMNS = ("devices", "tp", "pp", "seq_length", "micro_batch_size", "global_batch_size", "ppl",
                   "samples_per_s", "steps")
# columns that may be empty (not published); the others must be filled on every row
MAY_BE_EMPTY = ("ppl", "steps", "tp", "pp", "device_class", "micro_batch_size", "global_batch_size",
                "precision", "recompute", "source")

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "results" / "published"


def published_files(path: str | os.PathLike) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.csv"))
        if not files:
            raise UsageError(f"--against {path}: the folder holds no published tables (*.csv)")
        return files
    if not path.is_file():
        raise UsageError(f"--against {path}: no such file or folder; give a published table (.csv) or a folder of them")
    return [path]


def _read_one(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise UsageError(f"--against {path}: not a readable CSV table: {str(error).splitlines()[0]}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise UsageError(f"--against {path}: missing column(s) {', '.join(missing)}; "
                         f"a published table needs {', '.join(REQUIRED_COLUMNS)}")
    for column in OPTIONAL_COLUMNS:
        if column not in frame.columns:
            frame[column] = ""
    frame = frame.map(lambda v: v.strip() if isinstance(v, str) else v)
    for column in frame.columns:
        frame[column] = frame[column].replace({"-": ""})
    for index, row in frame.iterrows():
        line = index + 2  # the header is line 1
        for column in REQUIRED_COLUMNS:
            if column not in MAY_BE_EMPTY and row[column] == "":
                raise UsageError(f"--against {path}: line {line}: column {column} is empty; it must be filled")
        for column in NUMERIC_COLUMNS:
            value = row[column]
            if value == "":
                continue
            try:
                number = float(value)
            except ValueError:
                raise UsageError(f"--against {path}: line {line}: column {column} is {value!r}; "
                                 "accepted: a number, or empty for not published") from None
            if not number > 0:
                raise UsageError(f"--against {path}: line {line}: column {column} is {value!r}; "
                                 "accepted: a number > 0, or empty for not published")
        for column, values in BOOLEAN_COLUMNS.items():
            if row[column] != "" and row[column].lower() not in values:
                raise UsageError(f"--against {path}: line {line}: column {column} is {row[column]!r}; "
                                 "accepted: true, false, or empty for not published")
    for column in NUMERIC_COLUMNS:
        frame[column] = pd.to_numeric(frame[column].replace({"": None}), errors="coerce").astype("float64")
    for column, values in BOOLEAN_COLUMNS.items():
        frame[column] = frame[column].map(lambda v: values.get(v.lower()) if v else None).astype(object)
    frame["file"] = str(path)
    return frame


def load_published(path_or_dir: str | os.PathLike = DEFAULT_DIR) -> pd.DataFrame:
    """Every published row in a CSV file or a folder of them. Numeric columns are
    float (NaN = not published); a bad file raises UsageError naming it."""
    frames = [_read_one(p) for p in published_files(path_or_dir)]
    return pd.concat(frames, ignore_index=True)
