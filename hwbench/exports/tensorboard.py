"""TensorBoard scalars of each run, a folder per run under the log folder (OUT/<run id>/, and
OUT/<run id>-simulated/ for a run a stand-in ran and OUT/<run id>-emulated/ for FP8 computed without
FP8 units, so TensorBoard's run name says it), so
`tensorboard --logdir OUT` shows runs side by side. Written with torch's SummaryWriter (the
`tensorboard` extra: pip install 'hwbench[tensorboard]'). Exporting a run again replaces its
folder, and only a folder this export made: one holding MARKER_FILE with the run's id. A folder
of that name without it (the user's own, an earlier hwbench's) is refused before anything is
written; nothing outside OUT/<the run's folder> is ever removed.

Per step (x: the step number, warm-up included): `loss`, `grad_norm`, `lr`, `loss_scale` where
recorded; per timed step: `step_time_s` and the throughput it gives, `throughput/tokens_per_s`
and `throughput/samples_per_s` (one global batch over the step's time); per validation:
`validation/loss` and `validation/ppl`. Power is sampled over the timed window, not per step, so
`power/window_mean_w` (all devices) is one point, at the last timed step, where it was measured.
Wall times are the run's `started_at` plus the steps' times.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hwbench.errors import UsageError
from hwbench.exports.figures import unix_time
from hwbench.result.model import RunResult

MARKER_FILE = ".hwbench-tensorboard"  # in every run folder an export made: the run's id


def write_folder(runs: list[RunResult], out: Path) -> list[Path]:
    """Every run's folder under ``out``; UsageError, before anything is written, when one would
    replace a folder this export did not make."""
    for run in runs:
        _check_replaceable(run_folder(run, out), run)
    out.mkdir(parents=True, exist_ok=True)
    return [_write_run(run, out) for run in runs]


def run_folder(run: RunResult, out: Path) -> Path:
    """OUT/<run id>, `-simulated` or `-emulated` after it for a stand-in's run (RunResult.stand_in; the
    model holds the run id to one file name: never `..`, `.` or a path)."""
    return out / (run.run_id + (f"-{run.stand_in}" if run.stand_in else ""))


def _made_by_export(folder: Path, run: RunResult) -> bool:
    """Whether ``folder`` is what an export of ``run`` left: its marker naming the run and event
    files, nothing else (a file the user put beside them is theirs, and keeps the folder)."""
    marker = folder / MARKER_FILE
    if folder.is_symlink() or not folder.is_dir() or marker.is_symlink() or not marker.is_file():
        return False
    ours = all(entry.name == MARKER_FILE or (entry.name.startswith("events.out.tfevents.") and entry.is_file()
                                             and not entry.is_symlink()) for entry in folder.iterdir())
    return ours and marker.read_text(errors="replace").strip() == run.run_id


def _check_replaceable(folder: Path, run: RunResult) -> None:
    if (folder.exists() or folder.is_symlink()) and not _made_by_export(folder, run):
        raise UsageError(f"--out: {folder} exists and is not a folder this export made for run {run.run_id} (only "
                         f"event files and a {MARKER_FILE} naming the run); it is left alone: remove it yourself or "
                         "give another --out")


def _write_run(run: RunResult, out: Path) -> Path:
    """The run's event file in a temporary folder, then moved into its folder (replacing an
    earlier export of the same run, whose events would otherwise be shown twice)."""
    from torch.utils.tensorboard import SummaryWriter

    final = run_folder(run, out)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=out))
    try:
        writer = SummaryWriter(log_dir=os.fspath(staging))
        try:
            for tag, value, step, walltime in scalars(run):
                writer.add_scalar(tag, value, global_step=step, walltime=walltime)
        finally:
            writer.close()
        (staging / MARKER_FILE).write_text(run.run_id + "\n")
        if final.exists() or final.is_symlink():
            _check_replaceable(final, run)  # again: it may have changed since write_folder looked
            shutil.rmtree(final)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # the temporary folder made above, nothing else
        raise
    return final


def scalars(run: RunResult):
    """(tag, value, step, wall time) of every scalar the run recorded."""
    spec = run.spec
    clock = unix_time(run.started_at) or 0.0
    tokens = (spec.global_batch_size or 0) * (spec.seq_length or 0)
    last_timed = None
    for step in run.steps or []:
        clock += step.time_s or 0.0
        for tag in ("loss", "grad_norm", "lr", "loss_scale"):
            value = getattr(step, tag)
            if value is not None:
                yield tag, value, step.step, clock
        if step.phase == "timed" and step.time_s:
            last_timed = step.step
            yield "step_time_s", step.time_s, step.step, clock
            if tokens and spec.global_batch_size:
                yield "throughput/tokens_per_s", tokens / step.time_s, step.step, clock
                yield "throughput/samples_per_s", spec.global_batch_size / step.time_s, step.step, clock
    for validation in run.metrics.validation or []:
        for tag in ("loss", "ppl"):
            value = getattr(validation, tag)
            if value is not None:
                yield f"validation/{tag}", value, validation.step, clock
    telemetry = run.metrics.telemetry
    power = telemetry.total_power_w if telemetry else None
    if power is not None and last_timed is not None:
        yield "power/window_mean_w", power, last_timed, clock
