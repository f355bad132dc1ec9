"""hwbench as a library: what a notebook or another harness needs, without argv.

    import hwbench

    result = hwbench.run(model="tiny", steps=3, data="synthetic")   # a RunResult
    table = hwbench.load_results(["results/runs"])                  # a pandas DataFrame
    plans = hwbench.plan(model="1.3b", devices=8, device_memory="32GiB")
    text = hwbench.write_report(["results/runs"], format="md")

Each calls the library function its command calls (docs/api.md), so it takes the same
options and raises UsageError or SetupError with the line the command prints where the
command would exit 2. Nothing here prints, except the progress display of a run or
sweep when ``progress=True``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from hwbench.errors import UsageError
from hwbench.options import RunOptions
from hwbench.result.model import RunResult  # noqa: F401  (hwbench.RunResult)


def _options(options: RunOptions | Mapping[str, Any] | None, extra: Mapping[str, Any]) -> RunOptions:
    given = {} if options is None else (options.given() if isinstance(options, RunOptions) else dict(options))
    return RunOptions.from_mapping({**given, **extra})


def _paths(paths: Any, what: str) -> list[str]:
    """Files or folders: one path (text or a PathLike) is one path, not its characters."""
    if isinstance(paths, (str, os.PathLike)):
        return [os.fspath(paths)]
    items = list(paths) if isinstance(paths, Iterable) and not isinstance(paths, (bytes, Mapping)) else None
    if items is None or not all(isinstance(item, (str, os.PathLike)) for item in items):
        raise UsageError(f"{what} {paths!r} is not accepted; give a path or a list of paths"[:300])
    return [os.fspath(item) for item in items]


def run(options: RunOptions | Mapping[str, Any] | None = None, /, *, progress: bool = False, write: bool = True,
        **option_values: Any) -> RunResult:
    """One point, as `hwbench run`: options as RunOptions, a mapping or keyword arguments
    with its names (model="1.3b", nproc_per_node=8). The result, stored as the command
    stores it (--out, else the temp folder) unless ``write`` is False."""
    from hwbench.harness.run import run_and_store

    outcome = run_and_store(_options(options, option_values), show_progress=progress, write=write)
    if outcome.result is None:
        raise RuntimeError("; ".join(outcome.notes) or "this process holds no result: rank 0 has it")
    return outcome.result


def sweep(suite: str | os.PathLike, *, out: str | os.PathLike = "results/runs", device: str | None = None,
          nproc_per_node: int | None = None, repeats: int = 1, force: bool = False, plan: bool = True,
          progress: bool = False, slurm=None) -> list:
    """Every point of a suite (a file or a shipped suite's name), as `hwbench sweep`: a
    PointRecord per point (results, how many were kept, repeat statistics). ``slurm``, a
    hwbench.harness.slurm.SlurmSettings: every point a Slurm job (docs/slurm.md)."""
    from hwbench.harness.executor import SweepOptions
    from hwbench.harness.sweep import run_sweep

    options = SweepOptions(out_dir=out,  # type: ignore[arg-type]  # SweepOptions checks it and makes it a Path
                           device=device, nproc_per_node=nproc_per_node, repeats=repeats, force=force,
                           plan=plan)
    return run_sweep(suite, options, slurm=slurm, progress=progress)


def plan(*, devices: int, device_memory: str | int | None = None, device_model: str | None = None,
         model: str | None = None, device: str | None = None, headroom: float | None = None,
         **option_values: Any) -> list:
    """Every layout and variant of ``devices`` with its predicted per-rank peak memory, as
    `hwbench plan`, smallest peak first (PlannedLayouts); hwbench.layouts.plan_layouts
    says what ``device_memory``, ``device_model`` and ``device`` take."""
    from hwbench.layouts import plan_layouts

    base = _options(None, {"data": "synthetic", "model": model, **option_values})
    return plan_layouts(base, devices, device_memory=device_memory, device_model=device_model, device=device,
                        headroom=headroom).layouts


def load_results(paths: str | os.PathLike | Iterable[str | os.PathLike]):
    """Every result under ``paths`` (files or folders, searched recursively), each run once,
    as a pandas DataFrame: a row per run, fields flattened with dots (spec.model,
    metrics.tokens_per_s) and `path`. Files left out (unreadable, a copy of a run already
    read) in ``frame.attrs["skipped"]``: (path, reason)."""
    from hwbench.result.store import read_inputs
    from hwbench.result.table import frame_of

    found, skipped = read_inputs(_paths(paths, "paths"), "paths")  # a path that does not exist is a typo: refused
    frame = frame_of(found)
    frame.attrs["skipped"] = [(str(path), reason) for path, reason in skipped]
    return frame


def write_report(paths: str | os.PathLike | Iterable[str | os.PathLike] = (), *, format: str = "md",
                 out: str | os.PathLike | None = None, against: str | os.PathLike | None = None,
                 prices: Mapping[str, float] | None = None, tokens: float | None = None,
                 projection_devices: int = 8, also_formula: str | None = None) -> str:
    """The `hwbench report` document as text (md, csv, json, html), written to ``out`` when
    given. ``tokens`` None: 20 per parameter; ``prices``: USD per device-hour by device;
    ``also_formula``: a FLOPs formula whose MFU is shown beside the default's."""
    from hwbench.report import write_report as write

    text, _skipped = write(_paths(paths, "RESULTS"), format, against, prices or {}, tokens, projection_devices, out,
                           also_formula)
    return text


def export(format: str, paths: str | os.PathLike | Iterable[str | os.PathLike], *,
           out: str | os.PathLike | None = None, push: str | None = None, job: str = "hwbench",
           submitter: str | None = None, division: str | None = None, status: str | None = None,
           platform: str | None = None):
    """Results in another tool's format, as `hwbench export` (docs/exports.md): an
    ExportOutcome (``text`` of a text format, the files ``written``, the files ``skipped`` and
    runs ``left_out`` with their reasons). hwbench.exports.PushError when ``push`` fails."""
    from hwbench.exports import ExportRequest
    from hwbench.exports import export as export_results

    request = ExportRequest(submitter=submitter, division=division, status=status, platform=platform, push=push,
                            job=job)
    return export_results(format, _paths(paths, "RESULTS"), out, request)


def archive(paths: str | os.PathLike | Iterable[str | os.PathLike], *, out: str | os.PathLike):
    """Every result under ``paths`` with its logs, the report, the machines' descriptions and a
    SHA-256 manifest in one .tar.gz, as `hwbench archive`: an ArchiveOutcome (``path``,
    ``results``, ``files``, ``skipped``)."""
    from hwbench.report.archive import make_archive

    return make_archive(_paths(paths, "RESULTS"), out)


def verify_archive(path: str | os.PathLike) -> int:
    """`hwbench archive --verify`: how many files match the manifest, else
    hwbench.report.archive.ArchiveProblem naming each file that does not."""
    from hwbench.report.archive import verify_archive as verify

    return verify(path)


def preflight(*, device: str = "auto", out: str | os.PathLike = "results/runs", nproc_per_node: int = 1,
              threads_per_rank: int | None = None):
    """The machine checked before it is measured, as `hwbench preflight`: a PreflightReport
    (``checks``, each with ``status``, ``reading``, ``value``, ``reason``; ``worst``; ``to_dict()``)."""
    from hwbench.harness.preflight import check_request
    from hwbench.harness.preflight import preflight as check

    check_request(device, nproc_per_node, threads_per_rank)
    return check(device, out, nproc_per_node, threads_per_rank)


def accept(*, suite: str | os.PathLike, baseline: str | os.PathLike, out: str | os.PathLike,
           min_ratio: float = 0.95, outlier: float = 0.05, repeats: int = 1, device: str | None = None,
           devices_per_node: int | None = None, format: str = "md", progress: bool = False, slurm=None):
    """A delivered system judged, as `hwbench accept` (docs/accept.md): (an Acceptance with ``passed``,
    ``exit_status``, ``failures``, ``missing``, ``probes``, ``points``; the page written)."""
    from hwbench.harness.accept import AcceptOptions
    from hwbench.harness.accept import accept as run_acceptance

    # out as given: AcceptOptions refuses "" (Path("") would be the current folder) and makes it a Path
    options = AcceptOptions(suite=os.fspath(suite), baseline=os.fspath(baseline), out_dir=out,  # type: ignore[arg-type]
                            min_ratio=min_ratio, outlier=outlier, repeats=repeats, device=device,
                            devices_per_node=devices_per_node, page_format=format)
    return run_acceptance(options, slurm=slurm, progress=progress)


def baseline_save(paths: str | os.PathLike | Iterable[str | os.PathLike], *, out: str | os.PathLike) -> dict:
    """A baseline file from results, as `hwbench baseline save`: its content (points, machine, software, date)."""
    from pathlib import Path

    from hwbench.paths import check_output_file
    from hwbench.report.baseline import save_baseline
    from hwbench.result.store import read_inputs

    inputs = _paths(paths, "RESULTS")
    check_output_file(out, "--out", inputs)  # as the command: "" and a path under a file refused before reading
    found, _skipped = read_inputs(inputs, "RESULTS")
    return save_baseline([result for result, _ in found], Path(out))
