"""`hwbench calibrate`: measure the GEMM rate and copy bandwidth this device really reaches
and keep them per device model and driver, so that runs report MFU against them too."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from hwbench.calibration import (DEFAULT_COPY_BYTES, DEFAULT_PRECISIONS, DEFAULT_REPEATS, DEFAULT_SIZES,
                                 DEFAULT_WARMUP)
from hwbench.calibration.store import PRECISIONS, STORE_ENV
from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import SetupError, UsageError
from hwbench.units import human_bytes

DESCRIPTION = (
    "Measure the dense GEMM rate (square matrix products of several sizes, random inputs, best median of the "
    "sizes) for each precision, and the device-memory copy bandwidth (bytes read + written), and store them per "
    "device model and driver. Runs on that device and driver then report `mfu_measured_ceiling` beside the data "
    f"sheet's `mfu`. The store: --store, else ${STORE_ENV}, else ~/.cache/hwbench/calibration.json "
    "(docs/methodology.md, 'Measured ceiling').")


def _by_kind(defaults: dict, text=lambda value: ",".join(map(str, value))) -> str:
    return "; ".join(f"{kind} {text(value)}" for kind, value in defaults.items())


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help=f"one of {', '.join(DEVICE_CHOICES)} (default auto)")
    parser.add_argument("--precisions", help=f"comma-separated, of {', '.join(PRECISIONS)} (default: "
                                             f"{_by_kind(DEFAULT_PRECISIONS)}; less those the device lacks)")
    parser.add_argument("--sizes", help=f"GEMM sizes n (n x n x n products), comma-separated (default: "
                                        f"{_by_kind(DEFAULT_SIZES)})")
    parser.add_argument("--copy-size", help=f"the copied buffer, e.g. 1GiB (default: "
                                            f"{_by_kind(DEFAULT_COPY_BYTES, human_bytes)}); the bandwidth counts "
                                            "twice it per copy (read + write)")
    parser.add_argument("--repeats", default=str(DEFAULT_REPEATS),
                        help=f"timed repetitions of each measurement (default {DEFAULT_REPEATS}, >= 2)")
    parser.add_argument("--warmup", default=str(DEFAULT_WARMUP),
                        help=f"untimed calls before each measurement (default {DEFAULT_WARMUP}, >= 1)")
    parser.add_argument("--threads", help="CPU: intra-op threads, at most the usable cores (default: the usable "
                                          "cores); part of the CPU's key")
    parser.add_argument("--store", help=f"the calibration store file (default: ${STORE_ENV}, else "
                                        "$XDG_CACHE_HOME or ~/.cache, /hwbench/calibration.json)")


def _integer(option: str, text: str, minimum: int) -> int:
    if not text.isascii() or not text.strip().isdigit() or int(text) < minimum:
        raise UsageError(f"{option} {text!r} is not accepted; accepted: an integer >= {minimum}")
    return int(text)


def _precisions(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(","))
    if not chosen or any(part not in PRECISIONS for part in chosen) or len(set(chosen)) != len(chosen):
        raise UsageError(f"--precisions {text!r} is not accepted; accepted: distinct values of "
                         f"{', '.join(PRECISIONS)}, comma-separated")
    return chosen


def _sizes(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isascii() and part.isdigit() and int(part) >= 1 for part in parts):
        raise UsageError(f"--sizes {text!r} is not accepted; accepted: positive integers (matrix sizes n), "
                         "comma-separated, e.g. 4096,8192,16384")
    return tuple(dict.fromkeys(int(part) for part in parts))


def _store_path(args: argparse.Namespace) -> tuple[Path, str]:
    """(the store file, the name an error gives it), checked before anything is measured."""
    from hwbench.calibration.store import CalibrationStoreError, default_store_path, load_store
    from hwbench.result.files import check_output_file, check_output_folder

    if args.store is not None:
        path, option = Path(args.store).expanduser(), "--store"
        if not args.store.strip():
            raise UsageError("--store '' is not accepted; give a file path")
    else:
        path = default_store_path()
        option = f"${STORE_ENV}" if os.environ.get(STORE_ENV, "").strip() else "the calibration store"
    check_output_file(path, option)
    # named by the value given, not by its folder, which is what cannot be written
    check_output_folder(path.parent, f"{option} {args.store if args.store is not None else str(path)!r}: its folder")
    try:
        load_store(path)
    except CalibrationStoreError as error:
        raise UsageError(f"{option} {error}; give another file, or move this one away") from None
    return path, option


def main(args: argparse.Namespace) -> int:
    if args.device not in DEVICE_CHOICES:
        raise UsageError(f"--device {args.device!r} is not accepted; accepted: {', '.join(DEVICE_CHOICES)}")
    requested = _precisions(args.precisions) if args.precisions is not None else None
    sizes = _sizes(args.sizes) if args.sizes is not None else None
    repeats = _integer("--repeats", args.repeats, 2)
    warmup = _integer("--warmup", args.warmup, 1)
    threads = _integer("--threads", args.threads, 1) if args.threads is not None else None
    from hwbench.units import parse_size

    copy_bytes = parse_size(args.copy_size, "--copy-size") if args.copy_size is not None else None
    if copy_bytes is not None and copy_bytes < 1:  # '0.5' parses to 0 bytes: there would be nothing to copy
        raise UsageError(f"--copy-size {args.copy_size!r} is not accepted; accepted: a size of at least 1 byte, "
                         "e.g. 256MiB")
    store, option = _store_path(args)

    from hwbench.calibration.measure import CalibrationSettings, calibrate
    from hwbench.calibration.store import CalibrationStoreError, record_calibration
    from hwbench.device import select_backend
    from hwbench.harness.device_check import device_model_name

    backend = select_backend(args.device)
    if threads is not None and backend.name != "cpu":
        raise UsageError(f"--threads {threads} is for --device cpu; this is {backend.name}: leave it out")
    if threads is not None:
        from hwbench.device.host import usable_cores

        # more threads than cores measures contention, not the CPU: the ceiling of an oversubscribed
        # configuration, which no run should be compared with (docs/methodology.md, 'Measured ceiling')
        cores = usable_cores()
        if threads > cores:
            raise UsageError(f"--threads {args.threads!r} is not accepted; accepted: an integer from 1 to {cores} "
                             f"(the cores this process may use)")
    if backend.simulated:
        raise SetupError(f"--device {backend.name}: the device is simulated (a stand-in runtime on the host CPU); "
                         "there is nothing to calibrate")
    backend.prepare_process(threads=threads)
    precisions, left_out = _device_precisions(backend, requested or DEFAULT_PRECISIONS[backend.name],
                                              explicit=requested is not None)
    driver, problem = backend.driver()
    if driver is None:
        raise SetupError(f"--device {backend.name}: the driver could not be read ({problem}); a ceiling is kept per "
                         "device model and driver, so it could not be matched to a run")
    model = device_model_name(backend)
    settings = CalibrationSettings(precisions=precisions, sizes=sizes or DEFAULT_SIZES[backend.name],
                                   copy_bytes=(DEFAULT_COPY_BYTES[backend.name] if copy_bytes is None
                                               else copy_bytes),
                                   repeats=repeats, warmup=warmup)
    print(f"calibrating {backend.name}: {model}, driver {driver}", file=sys.stderr, flush=True)
    calibration = calibrate(backend, model, driver, settings,
                            on_measured=lambda m: print(f"  {_label(m)} {_size_text(m)}: "
                                                        f"{_rate_text(m, 'median')}", file=sys.stderr, flush=True))
    if not any(m.rate for m in calibration.measurements if m.kind == "gemm"):
        # a run reads only GEMM ceilings: a copy figure alone would be stored for no run to use
        print(calibration_table(calibration))
        print(f"no GEMM rate was measured (every size skipped): nothing stored in {store}", file=sys.stderr)
        return 1
    try:
        record_calibration(store, calibration.store_update())
    except OSError as error:
        raise UsageError(f"{option} {store}: cannot be written: {error.strerror or error}") from None
    except CalibrationStoreError as error:  # replaced by something else while measuring
        raise UsageError(f"{option} {error}; give another file, or move this one away") from None
    print(calibration_table(calibration))
    print()
    for line in left_out:
        print(f"left out {line}")
    for precision in precisions:
        if calibration.ceiling(precision) is None:
            print(f"warning: GEMM {precision}: every size skipped; no {precision} rate stored (an earlier one stays)",
                  file=sys.stderr)
    copy = next(m for m in calibration.measurements if m.kind == "copy")
    if copy.rate is None:
        given = (f"--copy-size {args.copy_size}" if args.copy_size is not None
                 else f"the {human_bytes(copy.size)} copy")
        print(f"warning: {given}: skipped ({copy.skipped}); no copy bandwidth stored (an earlier one stays)",
              file=sys.stderr)
    where = f"stored in {store} under {backend.name} / {model} / driver {driver}: "
    read_by_runs = _runs_store()
    if read_by_runs is not None and _same_path(read_by_runs, store):
        print(where + "runs on this device and driver report mfu_measured_ceiling against these ceilings")
    else:
        print(where + f"runs read {read_by_runs or 'another store'}, not this file: run them with "
              f"{STORE_ENV}={shlex.quote(str(store))} to report mfu_measured_ceiling against these ceilings")
    return 0


def _runs_store() -> Path | None:
    """The store a run reads ($HWBENCH_CALIBRATION, else the default); None when it cannot be found."""
    from hwbench.calibration.store import default_store_path

    try:
        return default_store_path()
    except (RuntimeError, KeyError):
        return None


def _same_path(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve()
    except (OSError, RuntimeError):
        return one.absolute() == other.absolute()


def _device_precisions(backend, wanted: tuple[str, ...], explicit: bool) -> tuple[tuple[str, ...], list[str]]:
    """(the precisions to measure, each default one the device lacks with why); a precision asked
    for with --precisions that the device lacks is bad input."""
    problems = {p: backend.precision_problem(p) for p in wanted}
    if explicit:
        for precision, problem in problems.items():
            if problem:
                raise UsageError(f"--precisions {precision}: {problem}")
    return tuple(p for p in wanted if not problems[p]), [f"{p}: {problems[p]}" for p in wanted if problems[p]]


def _label(measurement) -> str:
    return f"GEMM {measurement.precision}" if measurement.kind == "gemm" else "copy"


def _size_text(measurement) -> str:
    if measurement.kind == "gemm":
        return f"{measurement.size}x{measurement.size}x{measurement.size}"
    return f"{human_bytes(measurement.size)} buffer"


def _rate_text(measurement, statistic: str) -> str:
    from hwbench.units import bandwidth_text, flops_rate_text

    if measurement.rate is None:
        return f"skipped: {measurement.skipped}"
    value = measurement.rate[statistic]
    return flops_rate_text(value) if measurement.kind == "gemm" else bandwidth_text(value)


def calibration_table(calibration) -> str:
    """The measurements, the best size of each precision marked as its ceiling."""
    from tabulate import tabulate

    best = {p: calibration.ceiling(p) for p in calibration.settings.precisions}
    rows = []
    for m in calibration.measurements:
        ceiling = m.rate is not None and (m.kind == "copy" or best.get(m.precision) is m)
        rows.append([_label(m), _size_text(m), _rate_text(m, "median"),
                     _rate_text(m, "p10") if m.rate else "-", _rate_text(m, "p90") if m.rate else "-",
                     f"{m.rate['cv']:.1%}" if m.rate else "-", m.calls_per_repetition if m.rate else "-",
                     m.input_sets if m.kind == "gemm" else "-", "yes" if ceiling else ""])
    title = (f"{calibration.device_kind}: {calibration.device_model}, driver {calibration.driver}; "
             f"{calibration.settings.repeats} timed repetitions of each after {calibration.settings.warmup} "
             "warm-up calls; copy counts bytes read + written")
    return title + "\n" + tabulate(rows, headers=["measurement", "size", "median", "p10", "p90", "CV",
                                                  "calls/rep", "input sets", "ceiling"], disable_numparse=True)
