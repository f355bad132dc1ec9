"""`hwbench accept`'s check of each device on its own: a short GEMM rate and copy bandwidth
(hwbench calibrate's measurements, hwbench/calibration/measure.py, with short settings) and a
short training point (the `tiny` workload through hwbench's own engine and timed loop,
hwbench/harness/worker.py), one process per device, one device after another so that no probe
competes with another.

A rank of a training job waits for the slowest rank at every collective, so every rank's step
time reads as the slowest one's: a slow device cannot be told from the job's per-rank figures.
Measured alone, each device shows its own rate, which `hwbench accept` sets against its peers.

On the CPU a probe runs one thread timed on the process's CPU clock (CpuClockTimer): on a host
shared with other work the wall clock measures that work too. HWBENCH_FAULT ``INDEX:STEP:slow``
(hwbench/harness/faults.py) makes every CPU measurement of device INDEX's probe (GEMM, copy and
training step) half as fast (a busy wait before each mark: every interval twice as long), for
testing that accept names it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hwbench.device.kinds import KINDS
from hwbench.errors import SetupError, UsageError
from hwbench.files import write_json_atomic
from hwbench.harness.faults import FAULT_ENV, Fault
from hwbench.result.store import utc_now

PROBE_PRECISION = "fp32"  # every device kind has it
PROBE_REPEATS = 7  # the spread of a device's rate is that of these repetitions
PROBE_TIMEOUT_S = 600.0
# --probe-time's bound: a probe is a warm-up and PROBE_REPEATS repetitions of each of its two
# measurements (16 x --probe-time), which must end within PROBE_TIMEOUT_S with room to start and
# for the training point (seconds)
MAX_PROBE_TIME_S = PROBE_TIMEOUT_S / 20
# the training point: tiny at seq 32, one sample a step, a few timed steps (about a second of one
# CPU core; on an accelerator the same point, a check that training runs there at its rate)
PROBE_TRAINING = {"model": "tiny", "data": "synthetic", "seq_length": 32, "micro_batch_size": 1,
                  "global_batch_size": 1, "warmup": 2, "steps": 7, "eval_iters": 0, "telemetry": False,
                  "precision": PROBE_PRECISION}
PROBES_FILE = "probes.jsonl"  # OUT/probes.jsonl: one probe a line
# a `slow` fault's share of the rate lost: far above the noise between probes, as the training
# job's SLOW_STEP_S is (on this project's shared 2-vCPU VM identical devices probed one after
# another differed by up to 35 % in GEMM rate and 24 % in training tokens/s, CPU clock and all:
# a 10 % slowdown was named in only about half the runs)
SLOWDOWN = 0.50


class CpuClockTimer:
    """The probe's step timer on the CPU: the process's CPU time (one thread), not the wall clock.
    A host shared with other work takes the core away at times; the wall clock counts those
    pauses, the CPU clock counts only the work (measured here: 8 GEMMs of 512 on one core took
    23-57 ms of wall time and 23-28 ms of CPU time). ``slow`` (HWBENCH_FAULT's slow kind): every
    interval made 1/(1 - SLOWDOWN) as long by a busy wait before each mark."""

    def __init__(self, slow: bool = False) -> None:
        self.slow, self._marks = slow, list[float]()

    def mark(self) -> None:
        now = time.process_time()
        if self.slow and self._marks:
            until = now + (now - self._marks[-1]) * SLOWDOWN / (1 - SLOWDOWN)
            while time.process_time() < until:
                pass
            now = time.process_time()
        self._marks.append(now)

    def intervals_s(self) -> list[float]:
        return [b - a for a, b in zip(self._marks, self._marks[1:])]


class _ProbeBackend:
    """The backend as the probe measures with it: on the CPU, CpuClockTimer step timers."""

    def __init__(self, backend: Any, slow: bool) -> None:
        self._backend, self._slow = backend, slow

    def step_timer(self) -> Any:
        return CpuClockTimer(self._slow) if self._backend.name == "cpu" else self._backend.step_timer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def _rate(measurement: Any) -> dict[str, Any] | None:
    rate = measurement.rate
    if rate is None:
        return {"median": None, "reason": measurement.skipped}
    return {"median": rate["median"], "min": rate["min"], "max": rate["max"], "n": rate["n"], "cv": rate["cv"]}


def training_point(backend: Any, measured: Any) -> dict[str, Any]:
    """PROBE_TRAINING trained on this process's device, as `hwbench run` trains it (the same
    engine and timed loop), its steps timed by ``measured``'s step timer: tokens/s of each timed
    step, as median, min, max, n and cv (a failure: median None and the reason)."""
    from hwbench.catalog import load_catalog
    from hwbench.engine import build_engine
    from hwbench.engine.distributed import single_process
    from hwbench.harness.faults import Heartbeat
    from hwbench.harness.progress import Progress
    from hwbench.harness.worker import make_data_source, measure
    from hwbench.spec import build_run_spec
    from hwbench.stats import summarize

    catalog = load_catalog()
    spec = build_run_spec({**PROBE_TRAINING, "device": backend.name}, catalog, check_paths=False)
    workload = catalog.workloads[spec.model]
    ctx = single_process(spec.parallel)
    try:
        data = make_data_source(spec, workload, backend, ctx)
        engine = build_engine(spec.model_config(workload.model), spec, backend, ctx)
        try:
            steps = measure(spec, measured, data, Progress("probe", spec.steps, spec.warmup, enabled=False), engine,
                            ctx, Heartbeat(0, None), None).step_times_s
        finally:
            engine.close()
    except Exception as error:  # recorded as data, as a run records it; GEMM and copy are kept
        return {"median": None, "reason": f"{type(error).__name__}: {str(error).strip() or 'no message'}"}
    rates = [spec.tokens_per_iteration / t for t in steps if t > 0]
    if not rates:
        return {"median": None, "reason": "no timed step took measurable time"}
    summary = summarize(rates)
    return {key: summary[key] for key in ("median", "min", "max", "n", "cv")}


def probe(device: str, index: int, min_time_s: float) -> dict[str, Any]:
    """Device ``index`` of this host measured: its model, GEMM rate (FLOP/s), copy bandwidth (bytes/s)
    and the training point's tokens/s."""
    from hwbench.calibration.measure import CalibrationSettings, measure_copy, measure_gemm, warm_up_device
    from hwbench.device import select_backend
    from hwbench.device_check import device_model_name

    backend = select_backend(device)
    # on the CPU one thread: CpuClockTimer counts one thread's time
    backend.prepare_process(local_rank=index, local_world_size=1, threads=1 if backend.name == "cpu" else None)
    fault = Fault.from_environ()
    measured: Any = _ProbeBackend(backend, slow=bool(fault and fault.kind == "slow" and fault.rank == index))
    defaults = KINDS[backend.name].calibration  # the probe's sizes are the kind's (device/kinds.py)
    settings = CalibrationSettings(precisions=(PROBE_PRECISION,), sizes=(defaults.probe_gemm_size,),
                                   copy_bytes=defaults.probe_copy_bytes, repeats=PROBE_REPEATS, warmup=2,
                                   min_time_s=min_time_s, device_warmup_s=min_time_s)
    warm_up_device(backend, settings)  # from idle clocks to those of sustained work, as calibrate does
    gemm = measure_gemm(measured, PROBE_PRECISION, settings.sizes[0], settings)
    copy = measure_copy(measured, settings.copy_bytes, settings)
    training = training_point(backend, measured)
    driver, _ = backend.driver()
    return {"host": socket.gethostname(), "device_kind": backend.name, "index": index,
            "device_model": device_model_name(backend), "driver": driver, "measured_at": utc_now(),
            "gemm_flops": _rate(gemm), "gemm_size": settings.sizes[0], "precision": PROBE_PRECISION,
            "copy_bytes_per_s": _rate(copy), "copy_buffer_bytes": settings.copy_bytes,
            "training_tokens_per_s": training, "training_point": training_settings(), "error": None}


def training_settings() -> dict[str, Any]:
    """The probe's training point as a record states it: what was trained."""
    return {key: PROBE_TRAINING[key] for key in ("model", "seq_length", "micro_batch_size", "warmup", "steps",
                                                 "precision")}


def probe_devices(device: str, count: int, min_time_s: float, out_dir: Path, say=lambda text: None,
                  records_file: str = PROBES_FILE) -> list[dict[str, Any]]:
    """Each of this host's ``count`` devices probed in its own process, one after another; a probe
    that fails is a record with its cause (``error``), never an exception. Each record is kept as
    one line of OUT/probes.jsonl (``records_file``) as soon as it is known (JSON Lines: no result
    file, so `hwbench report` and `baseline save` on OUT pass over it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    host, records = socket.gethostname(), []
    for index in range(count):
        part = out_dir / f".probe-{host}-{index}.json"  # the probe's own answer, hidden until read
        say(f"probing device {index} of {host}")
        command = [sys.executable, "-m", "hwbench.acceptance.device_probe", device, str(index), str(min_time_s),
                   str(part)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
            record = json.loads(part.read_text()) if done.returncode == 0 and part.is_file() else None
            cause = None if record else (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            record, cause = None, f"no answer within {PROBE_TIMEOUT_S:g} s"
        except (OSError, ValueError) as error:
            record, cause = None, str(error)
        part.unlink(missing_ok=True)
        record = record or failed_record(host, device, index, cause or "no record")
        append_records(out_dir / records_file, [record])
        records.append(record)
    return records


def failed_record(host: str, device: str, index: int | None, cause: str, **extra: Any) -> dict[str, Any]:
    """The record of a device (``index``) or a whole node (None) that gave no measurement: its cause."""
    return {"host": host, **extra, "device_kind": device, "index": index, "device_model": None, "gemm_flops": None,
            "copy_bytes_per_s": None, "training_tokens_per_s": None, "error": cause}


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Records appended to a JSON Lines file, each as soon as it is known."""
    with open(path, "a", encoding="utf-8") as lines:
        lines.writelines(json.dumps(record) + "\n" for record in records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hwbench.acceptance.device_probe")
    parser.add_argument("device")
    parser.add_argument("index", type=int)
    parser.add_argument("min_time_s", type=float)
    parser.add_argument("out")
    args = parser.parse_args(argv)
    try:
        if os.environ.get(FAULT_ENV):
            Fault.from_environ()  # a fault that cannot be read fails the probe with its reason
        write_json_atomic(args.out, probe(args.device, args.index, args.min_time_s))
    except (UsageError, SetupError) as error:  # the cause in one line, the last the parent reads
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
