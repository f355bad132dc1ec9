"""One benchmark point on this rank: build, warm up, measure, report.

run_point(spec) -> RunResult, alone or as one rank of a torchrun job (rank 0
merges every rank's figures: hwbench.harness.merge). Device and setup
problems raise before anything is built (SetupError / UsageError, exit 2,
nothing written); a failure during training is a result with status oom,
failed, invalid (bad data found while training) or numerics, or, as a rank,
a RankFailure that the launcher turns into one.
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from hwbench.catalog import Catalog, Workload
from hwbench.device import Backend
from hwbench.device.base import oom_figures
from hwbench.device.fingerprint import environment_fingerprint
from hwbench.device_check import checked_backend
from hwbench.engine import build_engine
from hwbench.engine.base import Engine, StepOutcome
from hwbench.engine.distributed import DistContext, RankEnvironment, init_distributed, single_process
from hwbench.errors import RankFailure, SetupError, UsageError
from hwbench.files import finite, write_json_atomic
from hwbench.harness.checkpointing import Checkpointer, CheckpointSaveError, ResumePlan, restart_attempt, resume_plan
from hwbench.harness.describe import describe_device, describe_workload
from hwbench.harness.faults import RESULT_FILE, RUN_DIR_ENV, SWEEP_ENV, Fault, Heartbeat, read_heartbeats
from hwbench.harness.goodput import PhaseClock
from hwbench.harness.merge import RankReport, merge_ranks
from hwbench.harness.profile import ProfilePlan, profile_or_reason, trace_folder, with_data_annotation
from hwbench.harness.progress import Progress
from hwbench.harness.slurm_env import SLURM_RUN_PREFIX, slurm_record
from hwbench.harness.stand_in import stand_in_readings
from hwbench.result.model import Engine as EngineSection
from hwbench.result.model import (
    Environment,
    Launch,
    RunError,
    RunResult,
    Status,
    SweepRecord,
    Telemetry,
    ValidationPoint,
)
from hwbench.result.store import new_run_id, utc_now
from hwbench.spec import RunSpec
from hwbench.stats import finite_or_none
from hwbench.workload.data import Batch, BuiltinCorpus, SampledData, SyntheticTokens
from hwbench.workload.moe import RoutingRecorder


def run_point(spec: RunSpec, catalog: Catalog, *, show_progress: bool = True,
              rank_env: RankEnvironment | None = None) -> RunResult | None:
    """Run the point in this process: alone (``rank_env`` None), or as one rank
    of a torchrun job. Every rank measures itself; rank 0 gathers the others'
    figures and returns the merged result (other ranks return None).

    Alone, a failure while training is returned as a result (status oom,
    failed, invalid, numerics). As a rank, it is raised (RankFailure): torchrun
    then stops the other ranks, which would otherwise wait in a collective, and
    records the traceback for the launcher."""
    clock = PhaseClock()  # initialisation from here to the first step (time to target), then the run's phases
    backend = checked_backend(spec)
    workload = catalog.workloads[spec.model]
    local_rank, local_world = (rank_env.local_rank, rank_env.local_world_size) if rank_env else (0, 1)
    try:
        backend.prepare_process(local_rank=local_rank, local_world_size=local_world, threads=spec.threads_per_rank)
        placement = backend.placement()
    except Exception as error:
        raise SetupError(f"--device {backend.name}: the device could not be prepared: {error}") from error
    fault = Fault.from_environ() if restart_attempt() == 0 else None  # a drill fails the first attempt only
    run_dir = os.environ.get(RUN_DIR_ENV) if rank_env else None
    rank = rank_env.rank if rank_env else 0
    previous_beat = read_heartbeats(run_dir).get(rank) if run_dir and restart_attempt() > 0 else None
    heartbeat = Heartbeat(rank, run_dir)
    if rank_env is None:
        ctx = single_process(spec.parallel)
    else:
        ctx = init_distributed(backend, spec.parallel, rank_env, spec.launch.timeout_s)
    plan = resume_plan(spec, ctx, run_dir, previous_beat)
    # Opening the data checks it (a bad .idx, a split with no training documents):
    # bad input, so it fails here, before a result exists.
    try:
        data = make_data_source(spec, workload, backend, ctx, plan)
    except UsageError as error:
        # as a plain UsageError, which is how the launcher knows a rank's refusal of bad input (by the
        # class name torchrun records): exit 2 and no result, as in one process, not a failed run
        raise UsageError(str(error)) from error
    result = RunResult(run_id=new_run_id(spec.model, backend.name), status="failed", spec=spec.to_dict(),
                       started_at=utc_now())
    progress = Progress(f"{spec.model} on {backend.name}" + (f" x{ctx.world_size}" if ctx.distributed else ""),
                        plan.end_iteration - plan.start_iteration, spec.warmup,
                        enabled=show_progress and ctx.rank == 0)
    report = None
    try:
        attempt = plan.attempt_spec(spec)  # a restart trains the steps left
        fingerprint = {**environment_fingerprint(backend), "slurm": slurm_record()}  # slurm: None outside Slurm
        result.environment = Environment.model_validate(fingerprint)
        result.device = describe_device(backend, catalog, spec.precision)
        result.workload = describe_workload(workload, spec)
        model_config = spec.model_config(workload.model)
        engine = build_engine(model_config, spec, backend, ctx)
        try:
            result.engine = EngineSection.model_validate(engine.describe())
            checkpoints = Checkpointer(spec, model_config, engine, data, ctx, backend, plan, run_dir)
            with clock.within("checkpoint_load"):
                checkpoints.load()
            checkpoints.started_training()
            profiling = profile_plan(spec, ctx, result.run_id)
            report = measure(attempt, backend, data, progress, engine, ctx, heartbeat, fault, checkpoints,
                             plan.start_iteration, clock, profiling)
            report.environment, report.placement = result.environment, placement
        finally:
            engine.close()
    except Exception as error:  # recorded as data: the run's status says what happened
        status, failure = describe_failure(error, backend, ctx.rank)
        heartbeat.fail(status, str(failure.message))
        if ctx.distributed:
            raise RankFailure(f"{status}: {failure.type}: {failure.message}") from error
        result.status, result.error = status, failure
    finally:
        progress.close()
    if report is not None:
        if ctx.distributed:
            progress.note("gathering every rank's figures")
        reports = ctx.gather_objects(report)  # None on every rank but 0
        if reports is not None:
            merge_ranks(result, attempt, workload, reports)
    result.finished_at = utc_now()
    if result.device.fp8_emulated:
        result.warnings.insert(0, f"{result.device.fp8_emulated}; the result is marked emulated and kept apart from "
                                  "the device's own figures")
    if backend.simulated:
        result.warnings.insert(0, f"device simulated: a stand-in ran the {backend.name} code path on the host "
                                  f"CPU; no figure here describes a {backend.name} device")
    return result if ctx.rank == 0 else None


def run_as_rank(spec: RunSpec, catalog: Catalog, rank_env: RankEnvironment, *,
                show_progress: bool) -> RunResult | None:
    """This process is one rank of a torchrun job. Rank 0 returns the merged result, or,
    when hwbench launched the job, leaves it (with the sweep's record) in the launcher's
    run folder; other ranks return None. A failure is raised out of the ``@record``-ed
    function, so torchrun's error file carries it to the launcher."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from hwbench.engine.distributed import shutdown

    @record
    def rank_main() -> RunResult | None:
        try:
            result = run_point(spec, catalog, show_progress=show_progress, rank_env=rank_env)
        finally:
            shutdown()
        if result is None:
            return None
        run_dir = os.environ.get(RUN_DIR_ENV)
        if run_dir:
            write_json_atomic(os.path.join(run_dir, RESULT_FILE), with_sweep_record(result).to_dict())
            return None
        launcher = "srun" if (rank_env.run_id or "").startswith(SLURM_RUN_PREFIX) else "external torchrun"
        result.launch = Launch.model_validate({"launcher": launcher, "run_id": rank_env.run_id,
                                               "master_addr": rank_env.master_addr,
                                               "master_port": rank_env.master_port})
        return result

    return rank_main()


def profile_plan(spec: RunSpec, ctx: DistContext, run_id: str) -> ProfilePlan | None:
    """Where this rank's --profile trace goes: beside rank 0's result, whose run id every rank learns."""
    if not spec.profile or spec.profile_steps is None:
        return None
    return ProfilePlan(out_dir=spec.out_dir, folder=trace_folder(ctx.broadcast_object(run_id)),
                       steps=spec.profile_steps, rank=ctx.rank)


def with_sweep_record(result: RunResult) -> RunResult:
    """``result`` with the sweep's record of the point when a sweep started it (SWEEP_ENV)."""
    if os.environ.get(SWEEP_ENV):
        result.sweep = SweepRecord.model_validate(json.loads(os.environ[SWEEP_ENV]))
    return result


def describe_failure(error: BaseException, backend: Backend, rank: int) -> tuple[Status, RunError]:
    if isinstance(error, UsageError):  # bad data found while training (a token outside the vocabulary)
        status: Status = "invalid"
    elif isinstance(error, CheckpointSaveError):  # the disk filled, the folder went away: not the training's fault
        status = "storage"
    else:
        status = "oom" if backend.is_out_of_memory(error) else "failed"
    text = str(error).strip()
    # with an OOM, requested_bytes and free_bytes: what the allocator said
    return status, RunError(type=type(error).__name__, message=text.splitlines()[0] if text else type(error).__name__,
                            traceback=traceback.format_exc(), rank=rank, **oom_figures(text) if status == "oom" else {})


def make_data_source(spec: RunSpec, workload: Workload, backend: Backend, ctx: DistContext,
                     plan: ResumePlan | None = None) -> SampledData:
    """The --data source: builtin corpus, synthetic tokens or a Megatron dataset,
    serving this rank's data-parallel share of every global batch (a Megatron dataset
    holds enough samples for the run's last step, resumed or not)."""
    batching: dict[str, Any] = dict(seq_length=spec.seq_length, micro_batch_size=spec.micro_batch_size,
                                    global_batch_size=spec.global_batch_size, seed=spec.seed,
                                    to_device=backend.to_device, dp_rank=ctx.dp_rank, dp_size=spec.parallel.dp)
    if spec.data == "builtin":
        return BuiltinCorpus(**batching)
    if spec.data == "synthetic":
        return SyntheticTokens(workload.model.vocab_size, **batching)
    from hwbench.workload.gpt_dataset import MegatronData

    train_steps = plan.end_iteration if plan else spec.warmup + spec.steps
    return MegatronData(spec.data, spec.split, train_steps=train_steps, eval_iters=spec.eval_iters,
                        eval_interval=spec.eval_interval, valid_prefix=spec.valid_data,
                        vocab_size=workload.model.vocab_size, **batching)


def global_routing(routing: RoutingRecorder, ctx: DistContext) -> list[list[list[float]]]:
    """Every step's routing over the data-parallel ranks (one collective after the timed loop,
    as the losses): assignments and drops summed, the load-balancing loss averaged."""
    steps = ctx.all_reduce(routing.steps(), "dp")
    steps[..., -1] /= ctx.dims.dp
    return steps.cpu().tolist()


def validate(engine: Engine, data: SampledData, spec: RunSpec, step: int) -> ValidationPoint:
    """Validation loss over eval_iters global batches and PPL = exp(min(20, loss)), as Megatron."""
    batches = (data.valid_batch(i) for i in range(spec.eval_iters * spec.gradient_accumulation_steps))
    loss, tokens = engine.evaluate(batches)
    return ValidationPoint(step=step, loss=finite_or_none(loss),
                           ppl=math.exp(min(20.0, loss)) if math.isfinite(loss) else None,
                           tokens=tokens, iters=spec.eval_iters)


def _eval_due(spec: RunSpec, data: SampledData, step: int, iteration: int) -> bool:
    """Validation after local ``step`` (global ``iteration``): every --eval-interval steps of the
    training, and after the last step."""
    return (
        spec.eval_iters > 0
        and data.has_validation
        and (step == spec.warmup + spec.steps or _periodic_eval(spec, iteration))
    )


def _periodic_eval(spec: RunSpec, iteration: int) -> bool:
    return spec.eval_interval > 0 and iteration % spec.eval_interval == 0


def _pace_of_first_micro_batch(spec: RunSpec, backend: Backend, progress: Progress,
                               next_batch: Callable[[], Batch]) -> Callable[[], Batch]:
    """``next_batch`` that tells ``progress`` when the first micro-batch's forward and backward are
    done (the second is asked for): a run of many slow micro-batches says its pace after the first,
    not after a whole step. Not under a pipeline, which asks for every micro-batch at once."""
    accumulation = spec.gradient_accumulation_steps
    if not progress.enabled or accumulation < 2 or spec.parallel.pp > 1:
        return next_batch
    asked = 0

    def fetch() -> Batch:
        nonlocal asked
        asked += 1
        if asked == 2:
            backend.synchronize()  # the device's work, not only the host's launches (a warm-up step)
            progress.first_work_done(1 / accumulation, f"the first micro-batch (1 of {accumulation} in a step)")
        return next_batch()

    return fetch


def measure(
    spec: RunSpec,
    backend: Backend,
    data: SampledData,
    progress: Progress,
    engine: Engine,
    ctx: DistContext,
    heartbeat: Heartbeat,
    fault: Fault | None,
    checkpoints: Checkpointer | None = None,
    first_iteration: int = 0,
    clock: PhaseClock | None = None,
    profiling: ProfilePlan | None = None,
) -> RankReport:
    """Warm-up steps (excluded), then timed steps bracketed by device syncs.
    Validation at --eval-interval and checkpoint saves at --save-interval run
    between timed steps, marked apart and left out of the step times (they do
    fall inside the telemetry window). After the measured window has closed: the
    last step's save and validation (a periodic validation before the save, as
    after any other step; the end-of-run one after it, so that a run resumed from
    that checkpoint reads the validation data an uninterrupted run would).
    With a target (--target-ppl, --target-loss) every validation, the last one too,
    runs inside the window and the run stops at the first that reaches it: reading a
    validation's loss is the one wait for the device the check needs, and every
    validation makes it anyway.

    Returns this rank's figures for rank 0 to merge (run_point adds its environment and placement);
    ``clock``: run_point's, started with it, for the report's ``init_s`` and the goodput's phases
    (without one, a clock from the first step: no initialisation measured). ``profiling``: --profile's
    extra steps, after all of that and after this rank's figures are taken (hwbench.harness.profile)."""
    measured_init = clock is not None
    clock = clock if clock is not None else PhaseClock(phase="other")
    validation: list[ValidationPoint] = []
    outcomes: list[StepOutcome] = []
    # an MoE model's routing, step by step (the engines hold their model as ``model``), and the time
    # its expert-parallel all-to-alls take (the native engine's clock; None without expert parallelism)
    routing = RoutingRecorder.of(getattr(engine, "model", None))
    all_to_all = getattr(engine, "all_to_all_clock", None)
    target = spec.target
    training_started = time.perf_counter()  # the clock of time to target starts at the first step
    clock.switch("warmup")
    progress.training_started(spec.gradient_accumulation_steps)

    def train(step: int) -> None:
        if fault:
            fault.maybe_trigger(ctx.rank, step)
        first = step == 1 and step <= spec.warmup  # a warm-up step: it may sync to time its first micro-batch
        outcomes.append(engine.train_step(_pace_of_first_micro_batch(spec, backend, progress, data.train_batch)
                                          if first else data.train_batch))
        if routing is not None:
            routing.step_done()
        if all_to_all is not None:
            all_to_all.step_done()
        backend.step_done()

    def validate_reached(iteration: int) -> bool:
        """Validate; whether the target is reached (the same on every rank: the loss is reduced)."""
        with clock.within("eval"):
            point = validate(engine, data, spec, iteration)
        point.elapsed_s = time.perf_counter() - training_started  # the loss was read: the device is done
        validation.append(point)
        return target is not None and target.met(getattr(point, target.metric))

    def saving(iteration: int) -> bool:
        if checkpoints is None:
            return False
        checkpoints.poll()  # an async save finished meanwhile: commit it (no wait)
        return checkpoints.due(iteration)

    for step in range(1, spec.warmup + 1):
        iteration = first_iteration + step
        train(step)
        heartbeat.step(step, "warmup", iteration)
        progress.step(step, loss=finite_or_none(outcomes[-1].loss.item()))  # warm-up may sync freely
        if _eval_due(spec, data, step, iteration):
            validate_reached(iteration)  # a target met here stops the run at the first validation after the warm-up
        if checkpoints is not None and saving(iteration):
            with clock.within("checkpoint_save"):
                checkpoints.save(iteration, timed=False)
    backend.synchronize()
    ctx.barrier()  # every rank starts the timed window together
    clock.switch("other")

    backend.reset_peak_memory()
    sampler = backend.telemetry_sampler(spec.telemetry_interval_s) if spec.telemetry else None
    timer = backend.step_timer()
    interval_is_step: list[bool] = []  # one entry per interval between marks
    if sampler:
        sampler.start()
    clock.switch("timed_steps")  # no wait for the device: the host's clock only
    wall_start = time.perf_counter()
    last = done = spec.warmup + spec.steps
    with backend.measuring(), backend.counting_host_syncs() as host_syncs:
        timer.mark()
        for step in range(spec.warmup + 1, last + 1):
            iteration = first_iteration + step
            train(step)
            timer.mark()
            interval_is_step.append(True)
            heartbeat.step(step, "timed", iteration)  # the host's count: the device may still be working on it
            progress.step(step)  # no loss read here: it would sync the device
            if step == last and target is None:
                break  # the last step's validation and save come after the window
            between = reached = False  # validation or a save after this step: an interval that is no step
            if _eval_due(spec, data, step, iteration):
                reached = validate_reached(iteration)
                between = True
            if checkpoints is not None and step < last and not reached and saving(iteration):
                with clock.within("checkpoint_save"):
                    checkpoints.save(iteration, timed=True)
                between = True
            if between:
                timer.mark()
                interval_is_step.append(False)
            if reached:
                done = step
                progress.note(f"target {target.text() if target else ''} reached at step {step}")
                break
    wall_time = time.perf_counter() - wall_start
    clock.switch("other")
    telemetry = sampler.stop() if sampler else None
    memory = backend.memory_stats()
    if backend.simulated:  # a stand-in's memory statistics and sensors are fixed values: recorded as none
        memory, telemetry = stand_in_readings(memory, telemetry)
    end = first_iteration + done
    if target is None and _eval_due(spec, data, last, end) and _periodic_eval(spec, end):
        validate_reached(end)
    if checkpoints is not None and checkpoints.save_dir is not None:
        progress.note(f"timed steps done; saving the checkpoint of step {end}")
        with clock.within("checkpoint_save"):
            checkpoints.save(end, timed=False)
    if checkpoints is not None:
        with clock.within("checkpoint_save"):
            checkpoints.finish()  # an async save still writing
    if target is None and _eval_due(spec, data, last, end) and not _periodic_eval(spec, end):  # after the window
        progress.note(f"timed steps done; validating ({spec.eval_iters} batches)")
        validate_reached(end)
    heartbeat.step(done, "done", end)
    step_times = [t for t, is_step in zip(timer.intervals_s(), interval_is_step) if is_step]
    # The loss of each step averaged over the data-parallel ranks here (one collective after the
    # timed loop), so the merged curve is the global batch's.
    losses = torch.stack([o.loss.detach().float().reshape(()) for o in outcomes])
    ctx.all_reduce(losses, "dp")
    losses /= ctx.dims.dp
    phases_s = clock.stop()
    report = RankReport(
        routing=None if routing is None else global_routing(routing, ctx),
        all_to_all_s=None if all_to_all is None else all_to_all.step_seconds(),
        rank=ctx.rank,
        local_rank=ctx.local_rank,
        node_rank=ctx.node_rank,
        host=heartbeat.record["host"],
        pid=heartbeat.record["pid"],
        coordinates={"pp": ctx.pp_rank, "dp": ctx.dp_rank, "tp": ctx.tp_rank},
        losses=[float(x) for x in losses.cpu()],
        grad_norms=[float(o.grad_norm.float()) for o in outcomes],
        lrs=[o.lr for o in outcomes],
        loss_scales=[None if o.loss_scale is None else float(o.loss_scale) for o in outcomes],
        skipped=[bool(o.skipped) for o in outcomes],  # read here, after the timed loop
        step_times_s=step_times,
        wall_time_s=wall_time,
        memory=memory,
        telemetry=None if telemetry is None else Telemetry.model_validate(finite(telemetry)),  # NaN as null
        host_syncs=host_syncs,
        data=data.describe(),
        validation=validation,
        checkpoints=checkpoints.describe() if checkpoints is not None else None,
        first_iteration=first_iteration,
        # the checkpoint's load included
        init_s=training_started - clock.started if measured_init else None,
        phases_s=phases_s if measured_init else None,  # without the initialisation, no run's whole
    )
    if profiling is not None:
        progress.note(f"timed steps done; profiling {profiling.steps} more steps (--profile)")
        report.profile = profile_or_reason(profiling, backend.name, last + 1, ctx.distributed,
                                           lambda step: _profiled_step(step, engine, data, backend, ctx, fault,
                                                                       heartbeat))
    return report


def _profiled_step(step: int, engine: Engine, data: SampledData, backend: Backend, ctx: DistContext,
                   fault: Fault | None, heartbeat: Heartbeat) -> None:
    """One --profile step: trained as any other (a drill's slow rank sleeps in it too), its batch
    fetch marked as data loading; its outcome is left out of the run's losses and step times."""
    if fault:
        fault.maybe_trigger(ctx.rank, step)
    engine.train_step(with_data_annotation(data.train_batch))
    backend.step_done()
    heartbeat.step(step, "profile")
