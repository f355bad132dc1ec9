"""hwbench as a library: what a notebook or another harness needs, without argv.

    import hwbench

    result = hwbench.run(model="tiny", steps=3, data="synthetic")   # a RunResult
    table = hwbench.load_results(["results/runs"])                  # a pandas DataFrame
    plans = hwbench.plan(model="1.3b", devices=8, device_memory="32GiB")
    text = hwbench.report(["results/runs"], format="md")

Each takes the same options as its command (docs/api.md) and raises UsageError or
SetupError where the command would exit 2. Nothing here prints, except the progress
display of a run or sweep when ``progress=True``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Mapping

from hwbench.options import RunOptions  # noqa: F401  (hwbench.RunOptions)
from hwbench.result.model import RunResult  # noqa: F401  (hwbench.RunResult)


def _options(options: RunOptions | Mapping[str, Any] | None, extra: Mapping[str, Any]) -> RunOptions:
    given = {} if options is None else (options.given() if isinstance(options, RunOptions) else dict(options))
    return RunOptions.from_mapping({**given, **extra})


def run(options: RunOptions | Mapping[str, Any] | None = None, /, *, progress: bool = False, write: bool = True,
        **option_values: Any) -> RunResult:
    """Train one point and measure it, as `hwbench run` does (in this process for one
    rank, as a torchrun job for several). Options as RunOptions, a mapping, or keyword
    arguments with `hwbench run`'s names (model="1.3b", nproc_per_node=8, ...). The result
    is written to its --out folder unless ``write`` is False; it is returned either way."""
    from hwbench.catalog import load_catalog
    from hwbench.harness.launcher import launch
    from hwbench.harness.worker import run_point
    from hwbench.result.store import write_result
    from hwbench.spec import build_run_spec

    chosen = _options(options, option_values)
    catalog = load_catalog()
    spec = build_run_spec(chosen, catalog)
    if spec.launch.world_size > 1 or spec.launch.nnodes > 1:
        result = launch(spec, chosen.to_argv() + ([] if progress else ["--quiet"]), catalog)
        if result is None:
            raise RuntimeError(f"node {spec.launch.node_rank} of a multi-node run holds no result; node 0 has it")
    else:
        result = run_point(spec, catalog, show_progress=progress)
    if write:
        write_result(result, spec.out_dir)
    return result


def sweep(suite: str | Path, *, out: str | Path = "results/runs", device: str | None = None,
          nproc_per_node: int | None = None, repeats: int = 1, force: bool = False, plan: bool = True,
          progress: bool = False, slurm=None) -> list:
    """Every point of a suite (a file or a shipped suite's name), each in its own process
    tree, resumable, as `hwbench sweep`; returns a PointRecord per point (its results,
    how many were kept from an earlier sweep, the repeat statistics). ``slurm``, a
    hwbench.harness.slurm.SlurmSettings, makes every point a Slurm job
    (`hwbench sweep --executor slurm`, docs/slurm.md)."""
    from hwbench.harness.suite import find_suite, load_suite
    from hwbench.harness.sweep import SweepOptions, run_sweep
    from hwbench.result.files import check_output_folder

    check_output_folder(out)
    options = SweepOptions(out_dir=Path(out), device=device, nproc_per_node=nproc_per_node, repeats=repeats,
                           force=force, plan=plan)
    loaded = load_suite(find_suite(str(suite)))
    if slurm is not None:
        from hwbench.harness.slurm import run_slurm_sweep

        return run_slurm_sweep(loaded, options, slurm, say=_stderr_line if progress else None)
    return run_sweep(loaded, options, show_progress=progress)


def _stderr_line(text: str) -> None:
    import sys

    print(text, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class PlannedLayout:
    """One layout and variant of `hwbench plan`, with its prediction for every stage."""

    tp: int
    pp: int
    dp: int
    variant: str
    stages: list  # MemoryPlan per pipeline stage
    fits: bool  # every stage fits the device at the headroom

    @property
    def peak_bytes(self) -> int:
        return max(stage.total_bytes for stage in self.stages)


def plan(*, devices: int, device_memory: str | int, model: str | None = None, device: str = "cuda",
         headroom: float | None = None, **option_values: Any) -> list[PlannedLayout]:
    """The predicted per-rank peak memory of every layout of ``devices`` (all variants
    that can run it), as `hwbench plan`, smallest peak first. ``device_memory``: bytes or
    a size such as "32GiB"; ``device``: the kind whose framework overhead to add."""
    from hwbench.catalog import load_catalog
    from hwbench.errors import UsageError
    from hwbench.planner import DEFAULT_HEADROOM, layouts, plan_for_all_stages, variants
    from hwbench.spec import build_run_spec
    from hwbench.units import parse_size

    capacity = device_memory if isinstance(device_memory, int) else parse_size(str(device_memory))
    headroom = DEFAULT_HEADROOM if headroom is None else headroom
    catalog = load_catalog()
    base = _options(None, {"data": "synthetic", "model": model, **option_values})
    found = []
    for tp, pp, dp in layouts(devices):
        for variant in variants(tp, pp, dp):
            try:
                spec = build_run_spec(base.merged(**variant.options(), nproc_per_node=devices, tp=tp, pp=pp),
                                      catalog, check_paths=False)
            except UsageError:
                continue  # a layout this model or batch cannot take
            stages = plan_for_all_stages(spec, catalog.workloads[spec.model].model, device)
            found.append(PlannedLayout(tp, pp, dp, variant.name, stages,
                                       all(stage.fits(capacity, headroom) for stage in stages)))
    return sorted(found, key=lambda layout: layout.peak_bytes)


def load_results(paths: str | Path | Iterable[str | Path]):
    """Every readable result under ``paths`` (files or folders, searched recursively) as
    one pandas DataFrame, a row per run: the result's fields flattened with dots
    (spec.model, metrics.tokens_per_s, device.device_model, ...) and `path`. Files left out
    (unreadable, or a second copy of a run already read) are in ``frame.attrs["skipped"]``
    as (path, reason) pairs."""
    import warnings

    import pandas as pd

    from hwbench.result.store import read_results

    found, skipped = read_results(paths)
    rows = [{"path": str(path), **result.to_dict()} for result, path in found]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        frame = pd.json_normalize(rows, max_level=3) if rows else pd.DataFrame()
    frame.attrs["skipped"] = [(str(path), reason) for path, reason in skipped]
    return frame


def report(paths: Iterable[str | Path], *, format: str = "md", against: str | Path | None = None,
           prices: Mapping[str, float] | None = None, tokens: float | None = None, projection_devices: int = 8) -> str:
    """The `hwbench report` document as text (md, csv, json or html). The files that
    could not be read are listed in it. ``tokens`` None: 20 tokens per parameter of each model."""
    from hwbench.report.build import make_report

    text, _skipped = make_report([str(p) for p in paths], format, against,
                                 prices or {}, tokens, projection_devices)
    return text
