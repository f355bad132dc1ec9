"""One result per run: the typed, versioned model (model.py), the upgrade of older files
(upgrade.py), where the files are (files.py), writing and reading them (store.py), and the
environment fields that change figures (environment.py). docs/results.md has the schema."""

from hwbench.result.model import RunResult
from hwbench.result.store import ResultFormatError, load_result, load_results, read_results, store_result, write_result

__all__ = ["RunResult", "ResultFormatError", "load_result", "load_results", "read_results", "store_result",
           "write_result"]
