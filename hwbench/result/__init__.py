"""One result per run: the typed, versioned model (model.py), the upgrade of older files
(upgrade.py), writing and reading them (store.py), and the environment fields that change
figures (environment.py); where the files are is hwbench/paths.py. docs/results.md has the schema.

``hwbench.result.RunResult``, ``load_result``, ``load_results``, ... are imported on first use,
so that a reader of one section does not build the model (pydantic) first."""

_STORE = ("ResultFormatError", "load_result", "load_results", "read_results", "store_result", "write_result")


def __getattr__(name: str):
    if name == "RunResult":
        from hwbench.result.model import RunResult

        return RunResult
    if name in _STORE:
        from hwbench.result import store

        return getattr(store, name)
    raise AttributeError(f"module 'hwbench.result' has no attribute {name!r}")
