"""`hwbench calibrate`: measure the GEMM rate and copy bandwidth this device really reaches
and keep them per device model and driver, so that runs report MFU against them too."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

from hwbench.arguments import argument
from hwbench.calibration import (
    DEFAULT_COPY_BYTES,
    DEFAULT_DEVICE_WARMUP_S,
    DEFAULT_MIN_TIME_S,
    DEFAULT_PRECISIONS,
    DEFAULT_REPEATS,
    DEFAULT_SIZES,
    DEFAULT_WARMUP,
)
from hwbench.calibration.store import PRECISIONS, STORE_ENV
from hwbench.device.kinds import DEVICE_CHOICES
from hwbench.errors import UsageError
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
    parser.add_argument("--device", default="auto", type=argument("--device", choices=DEVICE_CHOICES),
                        help=f"one of {', '.join(DEVICE_CHOICES)} (default auto)")
    parser.add_argument("--precisions", type=argument(
        "--precisions", tuple, normalize=_comma_parts,
        valid=lambda chosen: all(p in PRECISIONS for p in chosen) and len(set(chosen)) == len(chosen),
        accepts=f"distinct values of {', '.join(PRECISIONS)}, comma-separated"),
        help=f"comma-separated, of {', '.join(PRECISIONS)} (default: {_by_kind(DEFAULT_PRECISIONS)}; less those the "
             "device lacks)")
    parser.add_argument("--sizes", type=argument(
        "--sizes", tuple, normalize=_sizes, valid=lambda sizes: all(n >= 1 for n in sizes),
        accepts="positive integers (matrix sizes n), comma-separated, e.g. 4096,8192,16384"),
        help=f"GEMM sizes n (n x n x n products), comma-separated (default: {_by_kind(DEFAULT_SIZES)})")
    parser.add_argument("--copy-size", help=f"the copied buffer, e.g. 1GiB (default: "
                                            f"{_by_kind(DEFAULT_COPY_BYTES, human_bytes)}); the bandwidth counts "
                                            "twice it per copy (read + write)")
    parser.add_argument("--repeats", default=str(DEFAULT_REPEATS),
                        type=argument("--repeats", int, minimum=2, maximum=MAX_REPETITIONS),
                        help=f"timed repetitions of each measurement (default {DEFAULT_REPEATS}, 2 to "
                             f"{MAX_REPETITIONS})")
    parser.add_argument("--warmup", default=str(DEFAULT_WARMUP),
                        type=argument("--warmup", int, minimum=1, maximum=MAX_REPETITIONS),
                        help=f"untimed calls before each measurement (default {DEFAULT_WARMUP}, 1 to "
                             f"{MAX_REPETITIONS})")
    parser.add_argument("--min-time", default=str(DEFAULT_MIN_TIME_S), metavar="SECONDS",
                        type=argument("--min-time", float, minimum=0, above_minimum=True, maximum=MAX_SECONDS,
                                      accepts="seconds"),
                        help=f"each measurement's timed repetitions together last at least this (default "
                             f"{DEFAULT_MIN_TIME_S:g} s, > 0): the device's sustained rate, not a burst")
    parser.add_argument("--device-warmup", default=str(DEFAULT_DEVICE_WARMUP_S), metavar="SECONDS",
                        type=argument("--device-warmup", float, minimum=0, maximum=MAX_SECONDS, accepts="seconds"),
                        help=f"seconds of the largest GEMM before the first measurement, so the device is at the "
                             f"clocks of sustained work (default {DEFAULT_DEVICE_WARMUP_S:g}; 0: none)")
    parser.add_argument("--threads", type=argument("--threads", int, minimum=1),
                        help="CPU: intra-op threads, at most the usable cores (default: the usable cores); part of "
                             "the CPU's key")
    parser.add_argument("--store", help=f"the calibration store file (default: ${STORE_ENV}, else "
                                        "$XDG_CACHE_HOME or ~/.cache, /hwbench/calibration.json)")
    parser.add_argument("--force", action="store_true",
                        help="store a rate even when it is no ceiling (implausible for the device, repetitions "
                             "spread by more than 10%%, other work on the machine or device while measuring), "
                             "marked unreliable: runs then report mfu_measured_ceiling null with the reason")


# Far above any real need (the defaults are 20 and 3), and finite: 10**20 repetitions would run until killed.
MAX_REPETITIONS = 10_000
MAX_SECONDS = 3600  # --min-time and --device-warmup: an hour is already far beyond a sustained clock


def _comma_parts(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(","))


def _sizes(text: str) -> tuple[int, ...] | str:
    """The distinct sizes of "4096,8192", or the text as it is when a part is no number (refused)."""
    parts = _comma_parts(text)
    if not all(part.isascii() and part.isdigit() for part in parts):
        return text
    return tuple(dict.fromkeys(int(part) for part in parts))


def main(args: argparse.Namespace) -> int:
    requested, sizes = args.precisions, args.sizes
    from hwbench.units import decimal_size_note, parse_size

    copy_bytes = parse_size(args.copy_size, "--copy-size") if args.copy_size is not None else None  # >= 1 byte
    from hwbench.calibration.store import (
        CalibrationStoreError,
        record_calibration,
        resolve_store,
        same_file,
        store_runs_read,
    )

    store, option = resolve_store(args.store)

    from hwbench.calibration.measure import CalibrationSettings, calibrate, device_key, device_precisions, open_backend

    backend = open_backend(args.device, args.threads)
    precisions, left_out = device_precisions(backend, requested)
    model, driver = device_key(backend)
    settings = CalibrationSettings(
        precisions=precisions, sizes=sizes or DEFAULT_SIZES[backend.name],
        copy_bytes=(DEFAULT_COPY_BYTES[backend.name] if copy_bytes is None else copy_bytes), repeats=args.repeats,
        warmup=args.warmup, min_time_s=args.min_time, device_warmup_s=args.device_warmup)
    print(f"calibrating {backend.name}: {model}, driver {driver}", file=sys.stderr, flush=True)
    reading = decimal_size_note(args.copy_size, "--copy-size")
    if reading:  # once every option is checked: a refusal stays one line
        print(f"hwbench: note: {reading}", file=sys.stderr, flush=True)
    calibration = calibrate(backend, model, driver, settings, on_measured=lambda m: print(
        f"  {_label(m)} {_size_text(m)}: {_rate_text(m, 'median')}", file=sys.stderr, flush=True))
    if not any(m.rate for m in calibration.measurements if m.kind == "gemm"):
        # a run reads only GEMM ceilings: a copy figure alone would be stored for no run to use
        print(calibration_table(calibration))
        print(f"no GEMM rate was measured (every size skipped): nothing stored in {store}", file=sys.stderr)
        return 1
    update = calibration.store_update()
    refused = {precision: gemm["unreliable"] for precision, gemm in update["gemm"].items() if gemm["unreliable"]}
    if not args.force:
        for precision in refused:
            del update["gemm"][precision]
    if not update["gemm"]:  # every rate refused: the copy alone would be kept for no run to use
        print(calibration_table(calibration))
        _say_refused(refused, args.force)
        print(f"nothing stored in {store}", file=sys.stderr)
        return 1
    try:
        record_calibration(store, update)
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
        given = f"--copy-size {args.copy_size}" if args.copy_size is not None else f"the {human_bytes(copy.size)} copy"
        print(f"warning: {given}: skipped ({copy.skipped}); no copy bandwidth stored (an earlier one stays)",
              file=sys.stderr)
    _say_refused(refused, args.force)
    where = f"stored in {store} under {backend.name} / {model} / driver {driver}: "
    read_by_runs = store_runs_read()
    if read_by_runs is not None and same_file(read_by_runs, store):
        named = os.path.expanduser(os.environ.get(STORE_ENV, "").strip())
        relative = f" (runs started in this folder: ${STORE_ENV} is a relative path)" \
            if named and not os.path.isabs(named) else ""
        print(where + "runs on this device and driver report mfu_measured_ceiling against these ceilings" + relative)
    else:
        print(where + f"runs read {read_by_runs or 'another store'}, not this file: run them with "
              f"{STORE_ENV}={shlex.quote(str(store))} to report mfu_measured_ceiling against these ceilings")
    return 1 if refused and not args.force else 0


def _say_refused(refused: dict[str, str], forced: bool) -> None:
    """One line on stderr for each rate that is no ceiling: not stored, or (--force) stored marked."""
    for precision, reason in refused.items():
        if forced:
            print(f"warning: GEMM {precision}: stored marked unreliable (--force): {reason}; runs report "
                  "mfu_measured_ceiling null with this reason", file=sys.stderr)
        else:
            print(f"GEMM {precision}: not stored, this is no ceiling: {reason}; measure again when the machine is "
                  "quiet, or give --force to store it marked unreliable", file=sys.stderr)


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


def _clock_text(measurement) -> str:
    clock = measurement.sm_clock_mhz
    if clock is None:
        return "-"
    return f"{clock['mean']:.0f} ({clock['min']:.0f}-{clock['max']:.0f})"


def calibration_table(calibration) -> str:
    """The measurements, the best size of each precision marked as its ceiling; under the table
    the device warm-up and why no SM clock was read, each said once."""
    from tabulate import tabulate

    settings = calibration.settings
    best = {p: calibration.ceiling(p) for p in settings.precisions}
    columns: list[tuple[str, Callable[[Any], Any]]] = [
        ("measurement", _label), ("size", _size_text), ("median", lambda m: _rate_text(m, "median")),
        ("p10", lambda m: _rate_text(m, "p10") if m.rate else "-"),
        ("p90", lambda m: _rate_text(m, "p90") if m.rate else "-"),
        ("CV", lambda m: f"{m.rate['cv']:.1%}" if m.rate else "-"),
        ("calls/rep", lambda m: m.calls_per_repetition if m.rate else "-"),
        ("input sets", lambda m: m.input_sets if m.kind == "gemm" else "-"),
        ("timed s", lambda m: f"{m.timed_s:.2f}" if m.timed_s is not None else "-"),
        ("SM clock MHz mean (min-max)", _clock_text),
        ("ceiling", lambda m: "yes" if m.rate is not None and (m.kind == "copy" or best.get(m.precision) is m)
         else ""),
    ]
    title = (f"{calibration.device_kind}: {calibration.device_model}, driver {calibration.driver}; "
             f"{settings.repeats} timed repetitions of each, together at least {settings.min_time_s:g} s, after "
             f"{settings.warmup} warm-up calls; copy counts bytes read + written")
    warmed = calibration.device_warmup
    notes = [f"device warm-up: {warmed['seconds']:.1f} s of GEMM {warmed['precision']} {warmed['size']}" if warmed
             else f"device warm-up: none ({calibration.device_warmup_skipped})"]
    for reason in dict.fromkeys(m.sm_clock_unmeasured for m in calibration.measurements if m.sm_clock_unmeasured):
        notes.append(f"SM clock not read: {reason}")
    notes.append(_conditions_text(calibration.conditions, calibration.device_kind))
    table = tabulate([[cell(m) for _, cell in columns] for m in calibration.measurements],
                     headers=[header for header, _ in columns], disable_numparse=True)
    return "\n".join([title, table, *notes])


def _conditions_text(conditions: dict, device_kind: str) -> str:
    """'machine while measuring: other work took 47% of the CPUs' time; load average 4.1 -> 5.0 on 2
    usable cores; other processes on the device: none'."""
    host, processes = conditions.get("host") or {}, conditions.get("device_processes")
    share = host.get("others_cpu_share")
    loads = [host.get("load_average_1m_start"), host.get("load_average_1m_end")]
    parts = [
        f"other work took {share:.0%} of its CPUs' time" if share is not None
        else f"other work unmeasured ({host.get('others_cpu_share_unmeasured')})",
        "load average " + (" -> ".join(f"{load:.1f}" for load in loads) if None not in loads else "unknown")
        + f" on {host.get('usable_cores')} usable cores",
        "other processes on the device: " + (
            conditions.get("device_processes_unmeasured") or "unlisted" if processes is None
            else ", ".join(f"pid {p.get('pid')}" for p in processes) or "none"),
    ]
    if device_kind == "cpu":
        parts.pop()  # the CPU's other processes are the other work above
    return "machine while measuring: " + "; ".join(parts)
