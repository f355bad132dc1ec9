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

from hwbench.arguments import Option
from hwbench.errors import UsageError
from hwbench.options import RunOptions
from hwbench.result.model import RunResult  # noqa: F401  (hwbench.RunResult)


def _options(options: RunOptions | Mapping[str, Any] | None, extra: Mapping[str, Any]) -> RunOptions:
    if options is not None and not isinstance(options, (RunOptions, Mapping)):
        raise UsageError(f"options {repr(options)[:80]} is not accepted; give a RunOptions, a mapping of `hwbench run` "
                         "option names to values, or keyword arguments")
    given = {} if options is None else (options.given() if isinstance(options, RunOptions) else dict(options))
    return RunOptions.from_mapping({**given, **extra})


# --- the arguments that are no run option, checked here as run options are (hwbench.options.Option):
# a wrong value or type is the documented UsageError naming it, never a TypeError from deep inside


def _check(name: str, value: Any, kind: type = str, **rules: Any) -> Any:
    return Option(help="", name=name, type=kind, **rules).check(value)


def _switch(name: str, value: Any) -> bool:
    return _check(name, value, bool)


def _path_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _path(name: str, value: Any, what: str = "a path") -> str:
    """A path given as text or a PathLike, not empty (Path("") would be the current folder)."""
    return _check(name, value, normalize=_path_text, valid=lambda text: bool(text.strip()), accepts=what)


def _optional_path(name: str, value: Any, what: str = "a path") -> str | None:
    return None if value is None else _path(name, value, what)


def _optional_text(name: str, value: Any) -> str | None:
    return None if value is None else _check(name, value, valid=lambda text: bool(text.strip()), accepts="text")


def _slurm(value: Any) -> Any:
    from hwbench.suites.slurm import SlurmSettings

    return None if value is None else _check("slurm", value, SlurmSettings, accepts="a SlurmSettings or None")


def _paths(paths: Any, what: str) -> list[str]:
    """Files or folders: one path (text or a PathLike) is one path, not its characters; none empty."""
    if isinstance(paths, (str, os.PathLike)):
        items: list[Any] | None = [paths]
    else:
        items = list(paths) if isinstance(paths, Iterable) and not isinstance(paths, (bytes, Mapping)) else None
    texts = None if items is None else [_path_text(item) for item in items]
    if texts is None or not all(isinstance(text, str) and text.strip() for text in texts):
        raise UsageError(f"{what} {paths!r} is not accepted; give a path or a list of paths (none empty)"[:300])
    return texts


def run(options: RunOptions | Mapping[str, Any] | None = None, /, *, progress: bool = False, write: bool = True,
        **option_values: Any) -> RunResult:
    """One point, as `hwbench run`: options as RunOptions, a mapping or keyword arguments
    with its names (model="1.3b", nproc_per_node=8). The result, stored as the command
    stores it (--out, else the temp folder) unless ``write`` is False."""
    from hwbench.harness.run import run_and_store

    progress, write = _switch("progress", progress), _switch("write", write)
    outcome = run_and_store(_options(options, option_values), show_progress=progress, write=write)
    if outcome.result is None:
        raise RuntimeError("; ".join(outcome.notes) or "this process holds no result: rank 0 has it")
    return outcome.result


def sweep(suite: str | os.PathLike, *, out: str | os.PathLike = "results/runs", device: str | None = None,
          nproc_per_node: int | None = None, repeats: int = 1, force: bool = False, plan: bool = True,
          progress: bool = False, slurm=None) -> list:
    """Every point of a suite (a file or a shipped suite's name), as `hwbench sweep`: a
    PointRecord per point (results, how many were kept, repeat statistics). ``slurm``, a
    hwbench.suites.slurm.SlurmSettings: every point a Slurm job (docs/slurm.md)."""
    from hwbench.suites.executor import SweepOptions
    from hwbench.suites.sweep import run_sweep

    suite = _path("suite", suite, "a suite file or a shipped suite's name")
    options = SweepOptions(out_dir=out,  # type: ignore[arg-type]  # SweepOptions checks it and makes it a Path
                           device=device, nproc_per_node=nproc_per_node, repeats=repeats,
                           force=_switch("force", force), plan=_switch("plan", plan))
    return run_sweep(suite, options, slurm=_slurm(slurm), progress=_switch("progress", progress))


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

    if prices is not None and not isinstance(prices, Mapping):
        raise UsageError(f"prices {repr(prices)[:80]} is not accepted; give a mapping of device to USD per device-hour")
    text, _skipped = write(_paths(paths, "RESULTS"), format, _optional_path("against", against), prices or {}, tokens,
                           projection_devices, _optional_path("out", out), also_formula)
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

    request = ExportRequest(submitter=_optional_text("submitter", submitter),
                            division=_optional_text("division", division), status=_optional_text("status", status),
                            platform=_optional_text("platform", platform), push=_optional_text("push", push),
                            job=_check("job", job, valid=lambda text: bool(text.strip()), accepts="text"))
    return export_results(format, _paths(paths, "RESULTS"), _optional_path("out", out), request)


def archive(paths: str | os.PathLike | Iterable[str | os.PathLike], *, out: str | os.PathLike):
    """Every result under ``paths`` with its logs, the report, the machines' descriptions and a
    SHA-256 manifest in one .tar.gz, as `hwbench archive`: an ArchiveOutcome (``path``,
    ``results``, ``files``, ``skipped``)."""
    from hwbench.archives import make_archive

    return make_archive(_paths(paths, "RESULTS"), _path("out", out, "a file name ending in .tar.gz"))


def verify_archive(path: str | os.PathLike) -> int:
    """`hwbench archive --verify`: how many files match the manifest, else
    hwbench.archives.ArchiveProblem naming each file that does not."""
    from hwbench.archives import verify_archive as verify

    return verify(_path("verify", path, "an archive hwbench archive wrote"))


def preflight(*, device: str = "auto", out: str | os.PathLike = "results/runs", nproc_per_node: int = 1,
              threads_per_rank: int | None = None):
    """The machine checked before it is measured, as `hwbench preflight`: a PreflightReport
    (``checks``, each with ``status``, ``reading``, ``value``, ``reason``; ``worst``; ``to_dict()``)."""
    from hwbench.harness.preflight import check_request
    from hwbench.harness.preflight import preflight as check

    check_request(device, nproc_per_node, threads_per_rank)
    return check(device, _path("out", out, "a folder"), nproc_per_node, threads_per_rank)


def accept(*, suite: str | os.PathLike, baseline: str | os.PathLike, out: str | os.PathLike,
           min_ratio: float = 0.95, outlier: float = 0.05, repeats: int = 1, device: str | None = None,
           devices_per_node: int | None = None, format: str = "md", progress: bool = False, slurm=None):
    """A delivered system judged, as `hwbench accept` (docs/accept.md): (an Acceptance with ``passed``,
    ``exit_status``, ``failures``, ``missing``, ``probes``, ``points``; the page written)."""
    from hwbench.acceptance.accept import AcceptOptions
    from hwbench.acceptance.accept import accept as run_acceptance

    # out as given: AcceptOptions refuses "" (Path("") would be the current folder) and makes it a Path
    options = AcceptOptions(suite=_path("suite", suite, "a suite file or a shipped suite's name"),
                            baseline=_path("baseline", baseline, "a baseline file, a folder of results or a CSV"),
                            out_dir=out,  # type: ignore[arg-type]
                            min_ratio=min_ratio, outlier=outlier, repeats=repeats, device=device,
                            devices_per_node=None if devices_per_node is None else _check(
                                "devices_per_node", devices_per_node, int, minimum=1),
                            page_format=format)
    return run_acceptance(options, slurm=_slurm(slurm), progress=_switch("progress", progress))


def baseline_save(paths: str | os.PathLike | Iterable[str | os.PathLike], *, out: str | os.PathLike) -> dict:
    """A baseline file from results, as `hwbench baseline save`: its content (points, collectives, machine,
    software, date)."""
    from pathlib import Path

    from hwbench.judge.baseline import save_baseline
    from hwbench.paths import check_output_file
    from hwbench.result.store import read_input_files

    inputs = _paths(paths, "RESULTS")
    out = _path("out", out, "a file path")
    check_output_file(out, "--out", inputs)  # as the command: "" and a path under a file refused before reading
    files = read_input_files(inputs, "RESULTS")
    return save_baseline([result for result, _ in files.runs], Path(out), [result for result, _ in files.collectives])
