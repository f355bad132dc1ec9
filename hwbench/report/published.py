"""The published tables (results/published/*.csv) as data.

One row per published point; the format is described in docs/reports.md and
results/published/README.md.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pandas as pd

from hwbench.errors import UsageError

REQUIRED_COLUMNS = ("table", "name", "model", "params", "devices", "tp", "pp", "seq_length",
                    "ppl", "samples_per_s", "steps")
# The figure a table publishes is one of these, as the source gives it (the others empty): global
# samples/s (the ModelZoo GPT-2 tables), global tokens/s (DGX Cloud Benchmarking) or tokens/s per
# device (torchtitan's TPS/GPU, Megatron-Bridge's tokens/sec/GPU). Nothing is converted on disk.
THROUGHPUT_COLUMNS = ("samples_per_s", "tokens_per_s", "tokens_per_s_per_device")
OPTIONAL_COLUMNS = ("device_class", "micro_batch_size", "global_batch_size", "precision", "recompute", "source",
                    "tokens_per_s", "tokens_per_s_per_device", "tflops_per_device", "cp", "fsdp", "compile",
                    "recipe", "power_limit_w", "engine", "software", "source_model", "notes", "url", "date_read")
BOOLEAN_COLUMNS = {column: {"true": True, "false": False} for column in ("recompute", "fsdp", "compile")}
NUMERIC_COLUMNS = ("devices", "tp", "pp", "cp", "seq_length", "micro_batch_size", "global_batch_size", "ppl",
                   "samples_per_s", "tokens_per_s", "tokens_per_s_per_device", "tflops_per_device",
                   "power_limit_w", "steps")
# columns that must be filled on every row; the others may be empty (not published)
MUST_BE_FILLED = ("table", "name", "model", "params", "devices", "seq_length")
DATE_COLUMNS = ("date_read",)

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
    """``path``'s table, read and checked once per process while the file is unchanged (the API and
    a long-lived process read the same published tables for every report)."""
    try:
        stat = path.stat()
    except OSError as error:
        raise UsageError(f"--against {path}: not a readable CSV table: {error.strerror}") from None
    return _read_checked(path, path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _read_checked(path: Path, resolved: Path, mtime_ns: int, size: int) -> pd.DataFrame:
    """``path`` as given (named in refusals and the ``file`` column); ``resolved``, its mtime and size
    key the cache with it, so another working directory or a changed file reads again. Cached, so never
    handed out: load_published returns a concatenation (new data) of these."""
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
    frame = frame.map(lambda v: v.strip() if isinstance(v, str) else v).replace("-", "")  # "-": not published
    for index, row in frame.iterrows():
        _check_row(path, index + 2, row)  # the header is line 1
    for column in NUMERIC_COLUMNS:
        frame[column] = pd.to_numeric(frame[column].replace({"": None}), errors="coerce").astype("float64")
    for column, values in BOOLEAN_COLUMNS.items():
        frame[column] = frame[column].map(lambda v: values.get(v.lower()) if v else None).astype(object)
    frame["file"] = str(path)
    return frame


def _check_row(path: Path, line: int, row: pd.Series) -> None:
    """One row's cells, each refused in one line naming the file, line, column and what is accepted."""
    for column in MUST_BE_FILLED:
        if row[column] == "":
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
    if all(row[column] == "" for column in THROUGHPUT_COLUMNS):
        raise UsageError(f"--against {path}: line {line}: no published throughput; fill one of "
                         f"{', '.join(THROUGHPUT_COLUMNS)}")
    for column, values in BOOLEAN_COLUMNS.items():
        if row[column] != "" and row[column].lower() not in values:
            raise UsageError(f"--against {path}: line {line}: column {column} is {row[column]!r}; "
                             "accepted: true, false, or empty for not published")
    for column in DATE_COLUMNS:
        if row[column] != "" and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", row[column]):
            raise UsageError(f"--against {path}: line {line}: column {column} is {row[column]!r}; "
                             "accepted: a day as YYYY-MM-DD, or empty")


def tokens_per_s_per_device(pub: pd.Series) -> float:
    """A published row's tokens/s per device: the figure as published, else its global tokens/s
    (or samples/s x sequence length) divided by its devices."""
    if not pd.isna(pub["tokens_per_s_per_device"]):
        return float(pub["tokens_per_s_per_device"])
    tokens = pub["tokens_per_s"] if not pd.isna(pub["tokens_per_s"]) else pub["samples_per_s"] * pub["seq_length"]
    return float(tokens / pub["devices"])


def publishes_tokens(pub: pd.Series) -> bool:
    """Whether the row's figure is a token rate (a Llama table) rather than the GPT tables' samples/s."""
    return bool(pd.isna(pub["samples_per_s"]))


def table_title(table: str) -> str:
    """A table's heading: "Table 2" for the ModelZoo GPT-2 tables' numbers, else the table's own name."""
    return f"Table {table}" if str(table).isdigit() else str(table)


def load_published(path_or_dir: str | os.PathLike = DEFAULT_DIR) -> pd.DataFrame:
    """Every published row in a CSV file or a folder of them. Numeric columns are
    float (NaN = not published); a bad file raises UsageError naming it."""
    frames = [_read_one(p) for p in published_files(path_or_dir)]
    return pd.concat(frames, ignore_index=True)
