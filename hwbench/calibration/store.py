"""The calibration store: one JSON file of measured ceilings, one entry per (device kind,
device model, driver), each holding a GEMM rate per precision and a copy bandwidth.

Where it is: ``--store`` of `hwbench calibrate`; else ``$HWBENCH_CALIBRATION``; else
``$XDG_CACHE_HOME/hwbench/calibration.json`` (``~/.cache/hwbench/calibration.json``).
A run reads the same path (``$HWBENCH_CALIBRATION`` or the default) when its result is
assembled.

A new calibration of a key already stored replaces, precision by precision, what it
measured again (and the copy bandwidth); a precision it did not measure stays as it was,
with its own date. Another key is appended. The file is rewritten atomically under an
exclusive lock on its folder, so two calibrations never lose each other's entries.

Imports no torch: `hwbench run` and reports read it without a device.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hwbench.device.kinds import KINDS
from hwbench.errors import UsageError
from hwbench.files import write_json_atomic
from hwbench.paths import check_output_file, check_output_folder
from hwbench.result.model import MeasuredCeiling, validation_problem

STORE_ENV = "HWBENCH_CALIBRATION"
SCHEMA_VERSION = 1
PRECISIONS = ("fp32", "bf16", "fp16")
KEY_FIELDS = ("device_kind", "device_model", "driver")  # one entry per these
# The dense GEMM rates one device of a kind can plausibly reach: (lowest, highest) FLOP/s, each
# kind's in the registry (device/kinds.py, which says where the bounds come from).
PLAUSIBLE_FLOPS = {name: kind.calibration.plausible_flops for name, kind in KINDS.items()}
# A ceiling is the rate a device holds when nothing else runs. Its repetitions spread by more
# than MAX_CEILING_CV, or measured while other work took more than MAX_OTHERS_CPU_SHARE of the
# CPUs it ran on (CPU calibrations), or beside other processes on the device (accelerators),
# it is the rate of a shared device: a 2-vCPU machine shared with other test runs gave fp32
# 16.8 GFLOP/s at CV 15.6% against 163.6 quiet, and 27.2 GFLOP/s at CV 6.1% while others took
# most of its CPU time (the CV alone does not show it; the other work's share does).
MAX_CEILING_CV = 0.10
MAX_OTHERS_CPU_SHARE = 0.10


def flops_bounds(device_kind: str) -> tuple[float, float]:
    """(lowest, highest) plausible FLOP/s of one device of ``device_kind`` (PLAUSIBLE_FLOPS; the
    widest of them for a kind it does not name)."""
    return PLAUSIBLE_FLOPS.get(device_kind, (min(low for low, _ in PLAUSIBLE_FLOPS.values()),
                                             max(high for _, high in PLAUSIBLE_FLOPS.values())))


def implausible_flops(device_kind: str, flops: float) -> str | None:
    """Why ``flops`` cannot be the GEMM ceiling of one ``device_kind`` device, or None."""
    low, high = flops_bounds(device_kind)
    if flops < low:
        return (f"{flops:.4g} FLOP/s is not plausible for one {device_kind} device (less than {low:g}: the slowest "
                "reaches more)")
    if flops > high:
        return f"{flops:.4g} FLOP/s is not plausible for one device (more than {high:g})"
    return None


def not_a_ceiling(device_kind: str, flops: float, cv: Any, conditions: Any) -> list[str]:
    """Why a measured GEMM rate is not the device's ceiling: implausible for the kind, its
    repetitions spread too far, or the machine busy while it was measured (``conditions``, as
    hwbench.calibration.measure records them; a store written before they were recorded has none,
    and is judged by the rest). Empty when it is a ceiling."""
    problems = [problem for problem in [implausible_flops(device_kind, flops)] if problem]
    if isinstance(cv, (int, float)) and not isinstance(cv, bool) and cv > MAX_CEILING_CV:
        problems.append(f"its repetitions spread by CV {cv:.1%} (more than {MAX_CEILING_CV:.0%}): the device did not "
                        "run at one rate")
    conditions = conditions if isinstance(conditions, dict) else {}
    host = conditions.get("host") if isinstance(conditions.get("host"), dict) else {}
    share = host.get("others_cpu_share")
    if device_kind == "cpu" and isinstance(share, (int, float)) and share > MAX_OTHERS_CPU_SHARE:
        load = host.get("load_average_1m_end")
        problems.append(f"other work took {share:.0%} of the time of the CPUs it ran on (more than "
                        f"{MAX_OTHERS_CPU_SHARE:.0%}; load average {load if load is None else f'{load:.1f}'} on "
                        f"{host.get('usable_cores')} usable cores)")
    processes = conditions.get("device_processes")
    if isinstance(processes, list) and processes:
        pids = ", ".join(str(process.get("pid")) for process in processes[:5] if isinstance(process, dict))
        problems.append(f"{len(processes)} other process(es) computed on the device (pid {pids})")
    return problems


class CalibrationStoreError(ValueError):
    """The store file exists but is not a calibration store hwbench can read."""


def default_store_path() -> Path:
    """$HWBENCH_CALIBRATION, else $XDG_CACHE_HOME/hwbench/calibration.json, else
    ~/.cache/hwbench/calibration.json."""
    named = os.environ.get(STORE_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(cache) if cache else Path.home() / ".cache") / "hwbench" / "calibration.json"


def resolve_store(given: str | None) -> tuple[Path, str]:
    """(the store `hwbench calibrate` writes, as an absolute path; the name an error gives it):
    ``given`` (--store), else the store runs read. Checked before anything is measured: a
    folder that cannot be written or a file that is not a store is UsageError (one line)."""
    if given is not None:
        if not given.strip():
            raise UsageError("--store '' is not accepted; give a file path")
        path, option = Path(given).expanduser(), "--store"
    else:
        path = default_store_path()
        option = f"${STORE_ENV}" if os.environ.get(STORE_ENV, "").strip() else "the calibration store"
    check_output_file(path, option)
    # named by the value given, not by its folder, which is what cannot be written
    check_output_folder(path.parent, f"{option} {given if given is not None else str(path)!r}: its folder")
    try:
        load_store(path)
    except CalibrationStoreError as error:
        raise UsageError(f"{option} {error}; give another file, or move this one away") from None
    return path.absolute(), option


def store_runs_read() -> Path | None:
    """The store a run started now, here, would read ($HWBENCH_CALIBRATION, else the default),
    as an absolute path; None when there is none (no home folder)."""
    try:
        return default_store_path().absolute()
    except (RuntimeError, KeyError):
        return None


def same_file(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve()
    except (OSError, RuntimeError):
        return one.absolute() == other.absolute()


def empty_store() -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "entries": []}


def load_store(path: str | os.PathLike) -> dict[str, Any]:
    """The store at ``path``; an empty one when there is no file. CalibrationStoreError
    (its reason) for a file that cannot be read or is not a store of this version."""
    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # a folder, a FIFO or /dev/zero: never read (could block)
            raise CalibrationStoreError(f"{path}: not a regular file")
        text = path.read_text()
    except FileNotFoundError:
        return empty_store()
    except (OSError, UnicodeDecodeError) as error:
        raise CalibrationStoreError(f"{path}: cannot be read ({getattr(error, 'strerror', None) or error})") from None
    try:
        store = json.loads(text)
    except json.JSONDecodeError as error:
        raise CalibrationStoreError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    except ValueError:  # the one other ValueError of json.loads: more digits than Python converts to an int
        raise CalibrationStoreError(f"{path}: not JSON hwbench can read (an integer of more than "
                                    f"{sys.get_int_max_str_digits()} digits)") from None
    except RecursionError:
        raise CalibrationStoreError(f"{path}: not JSON hwbench can read (nested too deeply)") from None
    problem = _store_problem(store)
    if problem:
        raise CalibrationStoreError(f"{path}: {problem}")
    return store


def _store_problem(store: Any) -> str | None:
    if not isinstance(store, dict) or "entries" not in store:
        return "not a calibration store (no `entries`)"
    if store.get("schema_version") != SCHEMA_VERSION:
        return f"calibration store schema_version {store.get('schema_version')!r}; this hwbench reads {SCHEMA_VERSION}"
    if not isinstance(store["entries"], list):
        return "`entries` is not a list"
    for index, entry in enumerate(store["entries"]):
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in KEY_FIELDS):
            return f"entry {index} lacks {', '.join(KEY_FIELDS)}"
        if not isinstance(entry.get("gemm", {}), dict) or not isinstance(entry.get("copy") or {}, dict):
            return f"entry {index}: `gemm` and `copy` must be mappings"
    return None


def entry_key(entry: dict[str, Any]) -> tuple[str, str, str]:
    kind, model, driver = (entry[k] for k in KEY_FIELDS)
    return kind, model, driver


def find_entry(store: dict[str, Any], device_kind: str, device_model: str, driver: str) -> dict[str, Any] | None:
    return next((e for e in store["entries"] if entry_key(e) == (device_kind, device_model, driver)), None)


def merge_entry(store: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """The store with ``update`` (one key's new measurements) merged in: each precision
    measured replaces the stored one, the copy bandwidth too when measured; an unknown key
    is appended. Returns the merged entry."""
    current = find_entry(store, *entry_key(update))
    if current is None:
        current = {**{k: update[k] for k in KEY_FIELDS}, "gemm": {}, "copy": None}
        store["entries"].append(current)
    current["gemm"] = {**(current.get("gemm") or {}), **(update.get("gemm") or {})}
    if update.get("copy") is not None:
        current["copy"] = update["copy"]
    for field, value in update.items():  # host, last update: what this calibration says
        if field not in (*KEY_FIELDS, "gemm", "copy"):
            current[field] = value
    return current


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on the store's folder for a read-modify-write (no lock file left behind)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def record_calibration(path: str | os.PathLike, update: dict[str, Any]) -> dict[str, Any]:
    """Merge ``update`` into the store at ``path`` (created with its folders when missing),
    written atomically under the folder's lock. Returns the stored entry."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent):
        store = load_store(path)
        entry = merge_entry(store, update)
        write_json_atomic(path, store)
    return entry


def lookup_ceiling(path: str | os.PathLike, device_kind: str, device_model: str, driver: str | None,
                   driver_problem: str | None, precision: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the measured ceiling a run of ``precision`` on this device is compared with, None and
    the reason). The ceiling names its rate, when and under which driver it was measured,
    and the store it came from, so the result describes itself without the store."""
    if driver is None:
        return None, (f"the driver of the {device_kind} device {device_model!r} could not be read ({driver_problem}): "
                      "a measured ceiling is kept per device model and driver")
    try:
        store = load_store(path)
    except CalibrationStoreError as error:
        return None, f"calibration store unreadable: {error}"
    fix = f"run hwbench calibrate --device {device_kind}"
    entry = find_entry(store, device_kind, device_model, driver)
    if entry is None:
        return None, f"no calibration for {device_model} driver {driver} in {path}: {fix}"
    gemm = (entry.get("gemm") or {}).get(precision)
    if not isinstance(gemm, dict) or gemm.get("ceiling_flops") is None:
        return None, (f"the calibration of {device_model} driver {driver} in {path} has no {precision} GEMM rate: "
                      f"{fix} --precisions {precision}")
    if not _positive_number(gemm["ceiling_flops"]):
        return None, (f"the calibration of {device_model} driver {driver} in {path} is not usable "
                      f"(gemm.{precision}.ceiling_flops: must be a positive finite number, not "
                      f"{_short(gemm['ceiling_flops'])}): {fix} --precisions {precision}")
    copy = entry.get("copy") or {}
    ceiling = {"flops": float(gemm["ceiling_flops"]), "precision": precision, "size": gemm.get("best_size"),
               "cv": gemm.get("best_cv"), "measured_at": gemm.get("measured_at"), "device_model": device_model,
               "driver": driver, "torch_version": gemm.get("torch_version"),
               "hwbench_version": gemm.get("hwbench_version"),
               "copy_bytes_per_s": float(copy["bytes_per_s"]) if _positive_number(copy.get("bytes_per_s")) else None,
               "store": str(path)}
    # what the run copies into device.measured_ceiling must fit the result's shape, or every
    # reader would refuse the finished result: checked here, against the one definition of it
    problem = validation_problem(MeasuredCeiling, ceiling, "measured_ceiling")
    flops = float(gemm["ceiling_flops"])
    implausible = implausible_flops(device_kind, flops) if problem is None else None
    if problem or implausible:
        return None, (f"the calibration of {device_model} driver {driver} in {path} is not usable "
                      f"({problem or f'measured_ceiling.flops: {implausible}'}): {fix} --precisions {precision}")
    # stored with --force though it was judged no ceiling, or stored before that judgement was made
    busy = gemm.get("unreliable") or "; ".join(not_a_ceiling(device_kind, flops, gemm.get("best_cv"),
                                                            gemm.get("conditions")))
    if busy:
        return None, (f"the {precision} rate of {device_model} driver {driver} in {path} is no ceiling "
                      f"({_short_text(busy)}): {fix} --precisions {precision} when the machine is quiet")
    return ceiling, None


def _short_text(value: Any) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _positive_number(value: Any) -> bool:
    """A number > 0 that a float holds finitely (an integer of 400 digits is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) and number > 0


def _short(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {len(str(value))} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
