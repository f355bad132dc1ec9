"""One benchmark point from RunOptions to a stored result: run_and_store, what `hwbench
run` and hwbench.run call. In this process, as the launcher of a torchrun job, or as one
rank of a job torchrun or srun started; on every path the result carries the sweep's
record when a sweep started the point, and is stored so that no measurement is lost
(hwbench.result.store.store_result).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from hwbench.engine.distributed import RankEnvironment
from hwbench.errors import UsageError
from hwbench.harness.preflight import PreflightReport
from hwbench.options import RunOptions
from hwbench.result.model import Preflight, RunResult
from hwbench.result.store import StoredResult, store_result


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    result: RunResult | None  # None: another rank or node holds the result
    stored: StoredResult | None  # None: nothing written here (no result, or write=False)
    notes: tuple[str, ...] = ()  # for the user: run folders recovered, devices auto passed over, why no result
    preflight: PreflightReport | None = None  # the machine checked before the run (None: --no-preflight, a rank)


def run_and_store(options: RunOptions, *, show_progress: bool = True, write: bool = True,
                  on_preflight: Callable[[PreflightReport], None] | None = None) -> RunOutcome:
    """Check ``options`` (UsageError/SetupError before anything starts), check the machine
    (unless --no-preflight; ``on_preflight`` is given the report before the run starts), run the
    point and store its result in its --out folder (unless ``write`` is False)."""
    from hwbench.catalog import load_catalog
    from hwbench.fast import rank_options, resolve_settings
    from hwbench.harness.faults import Fault
    from hwbench.harness.launcher import launch, recover_stranded_runs
    from hwbench.harness.worker import run_as_rank, run_point, with_sweep_record
    from hwbench.spec import build_run_spec

    catalog = load_catalog()
    rank_env = RankEnvironment.from_environ()
    if rank_env is None:  # under srun: Slurm's ranks (hwbench.harness.slurm_env, docs/slurm.md)
        options, rank_env = _under_slurm(options)
    spec = build_run_spec(options, catalog, torchrun_world_size=rank_env.world_size if rank_env else None)
    spec = resolve_settings(spec, options, catalog)  # --settings fast: chosen for this device's memory
    Fault.from_environ(spec.launch.world_size, spec.warmup + spec.steps)  # a drill it can never meet: refused
    notes: list[str] = [f"--settings {spec.settings_choice}"] if spec.settings_choice and rank_env is None else []
    if rank_env is None:
        refuse_what_cannot_fit_the_host(spec, catalog)  # bad input: one line, before preflight prints anything
    checked = (machine_checked(spec.device, spec.out_dir, spec.launch.nproc_per_node, spec.threads_per_rank)
               if rank_env is None and options.value("preflight") else None)
    if checked is not None and on_preflight is not None:
        on_preflight(checked)
    if rank_env is not None:
        result = run_as_rank(spec, catalog, rank_env, show_progress=show_progress)
    else:
        notes += recover_stranded_runs()  # folders of launchers that were killed (docs/reliability.md)
        if spec.launch.world_size > 1 or spec.launch.nnodes > 1:
            argv = rank_options(options, spec).to_argv()  # under fast: the memory planned for, for every rank
            result = launch(spec, argv + ([] if show_progress else ["--quiet"]), catalog)
            if result is None:
                notes.append(f"node {spec.launch.node_rank}: its ranks finished; node 0 writes the result")
        else:
            result = run_point(spec, catalog, show_progress=show_progress)
    if result is not None:
        result = with_sweep_record(result)
        if checked is not None:
            with_preflight(result, checked)
        notes += [f"--device auto passed over {reason}; this run used the {result.device.backend}"
                  for reason in result.device.auto_passed_over or ()]
    stored = store_result(result, spec.out_dir) if result is not None and write else None
    return RunOutcome(result, stored, tuple(notes), checked)


def machine_checked(device: str, out_dir, ranks: int, threads_per_rank: int | None = None) -> PreflightReport | None:
    """hwbench preflight for a run this process launches: its device, this node's ranks and their
    threads, its --out. Before any rank starts, so that none of them counts as another process on
    the device. None when the device cannot be used here: the run then refuses it with its own
    one-line error, and a table of a machine that will not be measured says nothing. (Tasks srun
    starts as ranks are not checked: they start together.)"""
    from hwbench.device import detect_device, unavailable_reason
    from hwbench.harness.preflight import preflight

    if device == "auto":
        device = detect_device()  # the kind the run will use
    elif unavailable_reason(device) is not None:
        return None
    return preflight(device, out_dir, ranks, threads_per_rank)


def with_preflight(result: RunResult, checked: PreflightReport) -> None:
    """The readings into the result's environment; each failed check also a warning of the result."""
    result.environment.preflight = Preflight.model_validate(checked.to_dict())
    result.warnings = [*result.warnings, *(f"preflight {check.name} failed: {check.reading} ({check.reason})"
                                           for check in checked.of("failure"))]


# CPU ranks share the cores: beyond them they only time-slice (the run is marked oversubscribed).
# Eight per core still takes an 8-rank layout on a 1-core machine; --nproc-per-node 1024 would start
# 1,024 Python processes with torch (220 MiB each after `import torch`, torch 2.x on Linux x86-64).
CPU_RANKS_PER_CORE = 8


def refuse_what_cannot_fit_the_host(spec, catalog) -> None:
    """UsageError, before anything starts, for a CPU run this host cannot hold: more ranks than
    CPU_RANKS_PER_CORE per usable core, or ranks predicted (hwbench.planner, as `hwbench plan`)
    to need more than all of its memory together. The kernel's OOM killer would end such a run, or
    other processes of the machine, before it could record anything (--micro-batch-size 100000 of
    the tiny model was killed on a 24 GiB machine). Accelerators fail with their own out-of-memory
    error, which the run records."""
    from hwbench.device import select_backend
    from hwbench.device.host import usable_cores
    from hwbench.planner import plan_memory
    from hwbench.units import gib

    if spec.device not in ("cpu", "auto"):
        return
    backend = select_backend(spec.device)
    if backend.name != "cpu":
        return
    ranks, cores = spec.launch.nproc_per_node, usable_cores()
    if ranks > CPU_RANKS_PER_CORE * cores:
        raise UsageError(f"--nproc-per-node {ranks} is not accepted on the cpu; accepted: 1 to "
                         f"{CPU_RANKS_PER_CORE * cores} ({CPU_RANKS_PER_CORE} ranks per usable core, {cores} here)")
    capacity = backend.memory_stats().capacity_bytes
    if not capacity or spec.model not in catalog.workloads:
        return
    per_rank = plan_memory(spec, catalog.workloads[spec.model].model, backend.name).total_bytes
    if per_rank * ranks > capacity:
        ranks_option = f"--nproc-per-node {ranks} with " if ranks > 1 else ""
        raise UsageError(f"{ranks_option}--micro-batch-size {spec.micro_batch_size} and --seq-length "
                         f"{spec.seq_length} is not accepted on this cpu: predicted peak {gib(per_rank, 1, unit=True)} "
                         f"per rank x {ranks} rank(s), more than the host's {gib(capacity, 1, unit=True)} of memory; "
                         "give a smaller --micro-batch-size (`hwbench plan` shows the prediction)")


def _under_slurm(options: RunOptions) -> tuple[RunOptions, RankEnvironment | None]:
    """(options, rank environment) for a run started by srun: each task one rank (it
    gets torchrun's variables), or each task one node of the torchrun job hwbench
    launches (--nproc-per-node G with one task per node); unchanged elsewhere."""
    from hwbench.harness.slurm_env import SlurmTask, slurm_mode

    task = SlurmTask.from_environ()
    if task is None:  # not in a Slurm job
        return options, None
    mode = slurm_mode(task, options.given())
    if mode == "task":  # the job's nodes, tasks per node and rendezvous, not one node holding every rank
        launch = task.rank_launch_options(os.environ)
        os.environ.update(task.torchrun_environment(os.environ))
        return options.merged(**launch), RankEnvironment.from_environ()
    if mode == "node":
        return options.merged(**task.node_launch_options(os.environ)), None
    return options, None
