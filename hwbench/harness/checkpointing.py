"""Checkpoints in a run: where it resumes from, when it saves, each save made whole before
it is named latest (hwbench.checkpoint), and what every save and load cost.

What a checkpoint holds: the engine's state (model, optimizer, fp16 loss scaler; the
learning-rate schedule follows from the iteration), each rank's random-number generator
states, and, in the manifest, the iteration and the data position (samples consumed), so
a resumed run continues the same sample order (hwbench.workload.data).

Each save and load is measured on every rank: the bytes it wrote or read, its wall time
and so its GB/s, and how long training stalled for it (a synchronous save stalls for all
of it; an asynchronous one for the copy to host memory, and for any wait for it to finish
later). Rank 0 merges them into the result's ``checkpoint`` section.

A torchrun restart (``--max-restarts``) starts every rank again with the same options.
Rank 0 keeps the run's plan in the launcher's run folder (RESTART_FILE): the iterations it
started and ends at, and the last checkpoint this run committed. A restarted attempt
resumes from that checkpoint, trains to the same last iteration, and records the restart:
the steps computed since the checkpoint and lost, and the time from the checkpoint to
being ready to train again.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
from pydantic import BaseModel
from torch.distributed.checkpoint.api import CheckpointException

from hwbench.checkpoint import (
    RNG_FILE,
    SavedCheckpoint,
    commit,
    failed_save,
    find_checkpoint,
    iteration_folder_name,
    partial_folder,
    remove_partial_saves,
    sync_to_disk,
)
from hwbench.checkpoint.state import StateWrite
from hwbench.device import Backend
from hwbench.engine.base import Engine
from hwbench.engine.distributed import DistContext
from hwbench.files import write_json_atomic
from hwbench.result.model import CheckpointOperation, CheckpointRank, Checkpoints, Restart
from hwbench.result.store import utc_now
from hwbench.spec import RunSpec
from hwbench.workload.config import GPTConfig
from hwbench.workload.data import SampledData

RESTART_FILE = "checkpoints.json"  # in the launcher's run folder: the plan restarts resume by
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun's: 0 in the first attempt
# What a failed write raises: DCP gathers every rank's failure into a CheckpointException, a BaseException.
SAVE_ERRORS = (Exception, CheckpointException)


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (a full disk, a folder gone or read-only): the run
    ends with status ``storage``; the checkpoint named latest is the one before."""


def restart_attempt() -> int:
    """Which attempt of a torchrun job this process is: 0, then 1 after the first restart."""
    return int(os.environ.get(RESTART_COUNT_ENV, "0") or 0)


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """Where this attempt starts and where the run ends."""

    load: str | None  # the checkpoint folder this attempt loads, or None (from scratch)
    start_iteration: int  # steps done before this attempt's first
    end_iteration: int  # the step the run ends after
    restart: Restart | None = None  # this attempt's restart (its time lost once known: training_from)
    restarts: tuple[Restart, ...] = ()  # earlier attempts'
    restart_since: float | None = None  # time.time() of the checkpoint this attempt resumes from

    def attempt_spec(self, spec: RunSpec) -> RunSpec:
        """``spec`` with the warm-up and timed steps this attempt trains: all of them in a
        first attempt; after a restart the steps left, warm-up first (at most --warmup,
        leaving at least one timed step)."""
        left = self.end_iteration - self.start_iteration
        if left < 1:
            raise RuntimeError(f"nothing left to train: the checkpoint this attempt resumes from is already at the "
                               f"run's last step {self.end_iteration}")
        warmup = min(spec.warmup, left - 1)
        return dataclasses.replace(spec, warmup=warmup, steps=left - warmup)

    def training_from(self, now: float) -> ResumePlan:
        """This plan once training starts at ``now`` (time.time(), after the load): its restart
        with the time lost, from the checkpoint it resumes from to ``now``."""
        if self.restart is None or self.restart_since is None:
            return self
        lost = max(0.0, now - self.restart_since)
        return dataclasses.replace(self, restart=Restart.model_validate({**self.restart.dump(), "time_lost_s": lost}))


def resume_plan(spec: RunSpec, ctx: DistContext, run_dir: str | None, previous_heartbeat: dict | None) -> ResumePlan:
    """Rank 0 decides where this attempt starts (the others receive it): a first attempt from
    --load (or from scratch), a restarted one from the last checkpoint this run committed."""
    plan: ResumePlan | None = None
    if ctx.rank == 0:
        state = _read_restart_file(run_dir) if restart_attempt() > 0 else None
        if state:
            plan = _restarted_plan(state, previous_heartbeat)
        else:
            plan = _first_plan(spec)
            _write_restart_file(run_dir, RestartFile(start_iteration=plan.start_iteration,
                                                     end_iteration=plan.end_iteration, load=plan.load))
    plan = ctx.broadcast_object(plan)
    assert plan is not None  # rank 0 made it; the others received it
    return plan


def _first_plan(spec: RunSpec) -> ResumePlan:
    if spec.load is None:
        return ResumePlan(None, 0, spec.warmup + spec.steps)
    saved = find_checkpoint(spec.load)
    return ResumePlan(str(saved.path), saved.iteration, saved.iteration + spec.warmup + spec.steps)


def _restarted_plan(state: RestartFile, previous_heartbeat: dict | None) -> ResumePlan:
    latest = state.latest  # None: nothing saved by this run yet, so where the failed attempt itself started
    load, start, since = ((latest.path, latest.iteration, latest.committed_at) if latest
                          else (state.load, state.start_iteration, state.training_since))
    reached = (previous_heartbeat or {}).get("iteration")
    restart = Restart(attempt=restart_attempt(), resumed_from_iteration=start, reached_iteration=reached,
                      steps_lost=max(0, reached - start) if isinstance(reached, int) else None)
    return ResumePlan(load, start, state.end_iteration, restart, tuple(state.restarts), since)


class Committed(BaseModel):
    """The last checkpoint the run committed."""

    path: str
    iteration: int
    committed_at: float  # time.time()


class RestartFile(BaseModel):
    """RESTART_FILE: the run's plan, which rank 0 of each attempt reads and updates."""

    start_iteration: int
    end_iteration: int
    load: str | None
    restarts: list[Restart] = []  # the attempts restarted so far
    latest: Committed | None = None
    training_since: float | None = None  # time.time() when the last attempt began training


def _read_restart_file(run_dir: str | None) -> RestartFile | None:
    if not run_dir:
        return None
    try:
        return RestartFile.model_validate_json((Path(run_dir) / RESTART_FILE).read_bytes())
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def _write_restart_file(run_dir: str | None, state: RestartFile) -> None:
    if run_dir:
        write_json_atomic(Path(run_dir) / RESTART_FILE, state.model_dump(exclude_unset=True))


def _update_restart_file(run_dir: str | None, **changes: Any) -> None:
    state = _read_restart_file(run_dir)
    if state is not None:
        _write_restart_file(run_dir, state.model_copy(update=changes))


@dataclasses.dataclass
class _PendingSave:
    """A save whose engine write may still run in the background."""

    iteration: int
    save_dir: Path  # --save
    partial: Path
    write: StateWrite
    rng_file: Path
    started: float  # time.perf_counter() when the save began
    stall_s: float  # training blocked for it so far
    timed: bool  # inside the timed window
    manifest: dict[str, Any]

    @property
    def final(self) -> Path:
        """The folder rank 0 renames the partial one to when it commits the save."""
        return self.save_dir / iteration_folder_name(self.iteration)


@dataclasses.dataclass(frozen=True)
class RankLoad:
    """One load on this rank, measured where it ran."""

    iteration: int  # the checkpoint's
    path: str  # its folder
    bytes: int  # this rank's files: its engine state and generator states
    wall_time_s: float

    def part(self, rank: int) -> CheckpointRank:
        """This rank's figures as the result's load lists them."""
        return CheckpointRank(rank=rank, bytes=self.bytes, wall_time_s=self.wall_time_s,
                              gb_per_s=_gb_per_s(self.bytes, self.wall_time_s))


@dataclasses.dataclass(frozen=True)
class RankSave:
    """One save on this rank, measured where it finished."""

    iteration: int  # the step it saved after
    timed: bool  # inside the timed window
    bytes: int  # this rank's files: its engine state and generator states
    wall_time_s: float  # from the save's start to the end of its write
    stall_s: float  # training blocked for it (all of a synchronous save; an async one's copy and waits)

    def part(self, rank: int) -> CheckpointRank:
        """This rank's figures as the result's save lists them."""
        return CheckpointRank(rank=rank, bytes=self.bytes, wall_time_s=self.wall_time_s,
                              gb_per_s=_gb_per_s(self.bytes, self.wall_time_s), stall_s=self.stall_s)


@dataclasses.dataclass(frozen=True)
class RankCheckpoints:
    """This rank's saves and loads (each its own bytes and time), for rank 0 to merge
    (RankReport.checkpoints); its warnings; this attempt's restart and the earlier ones."""

    saves: list[RankSave]
    loads: list[RankLoad]
    warnings: list[str]
    restart: Restart | None
    restarts: list[Restart]
    latest: str | None  # the folder this rank committed last (rank 0)


class Checkpointer:
    """The saves and the load of one run on this rank (no-ops without --save and --load)."""

    def __init__(self, spec: RunSpec, model_config: GPTConfig, engine: Engine, data: SampledData,
                 ctx: DistContext, backend: Backend, plan: ResumePlan, run_dir: str | None) -> None:
        self.spec, self.engine, self.data, self.ctx, self.backend = spec, engine, data, ctx, backend
        self.plan, self.run_dir = plan, run_dir
        self.save_dir = Path(spec.save) if spec.save else None
        self.saves: list[RankSave] = []
        self.loads: list[RankLoad] = []
        self.warnings: list[str] = []
        self.pending: _PendingSave | None = None
        self.last_committed: str | None = None
        self.group = None
        if spec.async_save:
            from hwbench.checkpoint.native import checkpoint_group

            self.group = checkpoint_group(ctx.distributed)
        self.identity = {"model": spec.model, "model_config": dataclasses.asdict(model_config),
                         "engine": spec.engine, "fused_qkv": spec.fused_qkv, "precision": spec.precision,
                         "padded_vocab_size": model_config.padded_vocab_size(spec.parallel.tp),
                         "layout": {"tp": spec.parallel.tp, "pp": spec.parallel.pp, "dp": spec.parallel.dp,
                                    "zero_stage": spec.zero_stage, "fsdp": spec.fsdp,
                                    # only where it is used: a layout saved before --ep is the same layout
                                    **({"ep": spec.parallel.ep} if spec.parallel.ep > 1 else {})},
                         "world_size": spec.parallel.world_size}
        # what the data position counts in: saved beside it, and held against it on a load
        self.data_settings = {"source": spec.data, "seed": spec.seed, "global_batch_size": spec.global_batch_size,
                              "seq_length": spec.seq_length}
        if self.save_dir is not None and ctx.rank == 0:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            remove_partial_saves(self.save_dir)  # of a run killed mid-save
        ctx.barrier()

    # loading -----------------------------------------------------------------------------
    def load(self) -> None:
        """This attempt's checkpoint into the engine, the RNG states and the data position."""
        if self.plan.load is None:
            self.data.seek(0, 0)
            return
        saved = find_checkpoint(self.plan.load)
        started = time.perf_counter()
        bytes_read = self.engine.checkpoint_state().load(saved.path)
        self.engine.resume_at(saved.iteration)
        bytes_read += self._load_rng(saved)
        self.data.seek(**saved.data_position())
        self.backend.synchronize()
        wall = time.perf_counter() - started
        self.loads.append(RankLoad(iteration=saved.iteration, path=str(saved.path), bytes=bytes_read, wall_time_s=wall))
        self._warn_if_data_differs(saved)

    def _load_rng(self, saved: SavedCheckpoint) -> int:
        """This rank's generator states, when the checkpoint was saved by the same number of
        ranks in the same layout (another layout draws its numbers differently anyway)."""
        path = saved.path / RNG_FILE.format(rank=self.ctx.rank)
        if saved.manifest["layout"] != self.identity["layout"] or not path.is_file():
            self.warnings.append(f"random-number generator states not restored: {saved.path.name} was saved in "
                                 "another layout")
            return 0
        self.backend.set_rng_states(torch.load(path, weights_only=True))
        return path.stat().st_size

    def _warn_if_data_differs(self, saved: SavedCheckpoint) -> None:
        """Resuming with other data settings is allowed (Megatron-LM allows it: a longer context,
        another batch), but the position is counted in samples, so the run is no continuation of
        the saved one: said in the result. A manifest written before a key was kept is not judged."""
        data = saved.manifest["data"]
        changed = [f"--{key.replace('_', '-').replace('source', 'data')} {data[key]} then, {value} now"
                   for key, value in self.data_settings.items() if key in data and data[key] != value]
        if changed:
            self.warnings.append(
                f"resumed with other data than {saved.path.name} was saved with ({'; '.join(changed)}):"
                " the samples from here on are not the saved run's"
            )

    def started_training(self) -> None:
        """Called once the state is loaded: the time a restart's lost time runs to."""
        now = time.time()
        self.plan = self.plan.training_from(now)
        if self.ctx.rank == 0:
            restarts = list(self.plan.restarts) + ([self.plan.restart] if self.plan.restart else [])
            _update_restart_file(self.run_dir, training_since=now, restarts=restarts)

    # saving ------------------------------------------------------------------------------
    def due(self, iteration: int) -> bool:
        """Whether --save-interval asks for a save after ``iteration``."""
        interval = self.spec.save_interval
        return self.save_dir is not None and interval is not None and iteration % interval == 0

    def save(self, iteration: int, timed: bool) -> None:
        """Save after ``iteration`` into a partial folder; a synchronous save is committed
        (named latest) before this returns, an asynchronous one once its write finishes."""
        assert self.save_dir is not None
        self.finish()  # an earlier async save still writing: wait for it (its stall)
        started = time.perf_counter()
        partial = partial_folder(self.save_dir, iteration)
        try:
            if self.ctx.rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
                partial.mkdir(parents=True)
            self.ctx.barrier()
            rng_file = partial / RNG_FILE.format(rank=self.ctx.rank)
            torch.save(self.backend.rng_states(), rng_file)
            sync_to_disk(rng_file)  # timed to the disk, as the engine's files are
            write = self.engine.checkpoint_state().save(partial, self.ctx.rank, self.spec.async_save, self.group)
        except SAVE_ERRORS as error:
            self._failed(iteration, partial, error)
        manifest = {**self.identity, "iteration": iteration, "saved_at": utc_now(),
                    "data": {**self.data_settings, **self.data.position()}}
        self.pending = _PendingSave(iteration, self.save_dir, partial, write, rng_file, started, 0.0, timed, manifest)
        if self.spec.async_save:
            self.pending.stall_s = time.perf_counter() - started  # the copy to host memory
            self.poll()
        else:
            self.finish(stalled_since=started)

    def poll(self) -> None:
        """Commit an async save whose write has finished (a look, no wait)."""
        if self.pending is not None and self.pending.write.done():
            self.finish()

    def finish(self, stalled_since: float | None = None) -> None:
        """Wait for the save in progress, record it and (rank 0) commit it: the manifest, the
        rename, the latest file. Training stalls from ``stalled_since`` (default: now) to the end."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        waited = time.perf_counter() if stalled_since is None else stalled_since
        try:
            files = pending.write.wait(pending.partial, pending.final)
            if self.ctx.rank == 0:
                final = commit(pending.partial, pending.save_dir, pending.iteration, pending.manifest)
                self.last_committed = str(final)
                _update_restart_file(
                    self.run_dir,
                    latest=Committed(path=str(final), iteration=pending.iteration, committed_at=time.time()),
                )
        except SAVE_ERRORS as error:
            self._failed(pending.iteration, pending.partial, error)
        finished = pending.write.finished_at or time.perf_counter()
        self.saves.append(RankSave(
            iteration=pending.iteration, timed=pending.timed, bytes=self._written(pending, {*files, pending.rng_file}),
            wall_time_s=max(0.0, finished - pending.started),
            stall_s=pending.stall_s + (time.perf_counter() - waited)))

    def _written(self, pending: _PendingSave, files: set[Path]) -> int:
        """Bytes of ``files``, each where it is now: a file written in the partial folder may be in the
        committed one since (rank 0 renames it once its own write is done)."""
        return sum(_size(path) or (_size(pending.final / path.relative_to(pending.partial))
                                   if path.is_relative_to(pending.partial) else 0) for path in files)

    def _failed(self, iteration: int, partial: Path, error: BaseException) -> NoReturn:
        assert self.save_dir is not None
        text = failed_save(error, self.save_dir, iteration)  # before the partial save goes: a full disk shows
        if self.ctx.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)  # free what it took; it was never named latest
        raise CheckpointSaveError(text) from error

    def describe(self) -> RankCheckpoints:
        """This rank's saves and loads, for rank 0 to merge (RankReport.checkpoints)."""
        return RankCheckpoints(self.saves, self.loads, self.warnings, self.plan.restart, list(self.plan.restarts),
                               self.last_committed)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


# --- merged figures (rank 0) ------------------------------------------------------------


def merge_checkpoints(spec: RunSpec, per_rank: list[RankCheckpoints | None],
                      median_step_s: float | None) -> Checkpoints | None:
    """The result's ``checkpoint`` section from every rank's saves and loads: per operation the
    bytes of all ranks, the slowest rank's wall time, GB/s in total and per rank, the longest
    stall; the totals; the stall per hour of training that --save-interval costs at this step time."""
    ranks = [(rank, entry) for rank, entry in enumerate(per_rank) if entry]
    if not ranks or (spec.save is None and spec.load is None and not ranks[0][1].restarts and not ranks[0][1].restart):
        return None
    first = ranks[0][1]
    numbers = [rank for rank, _entry in ranks]
    # the i-th save (load) of every rank, as far as all have one
    saves = [_merge_save(numbers, same) for same in zip(*(entry.saves for _rank, entry in ranks))]
    loads = [_merge_load(numbers, same) for same in zip(*(entry.loads for _rank, entry in ranks))]
    unmeasured: dict[str, str] = {}
    section = Checkpoints(save_dir=spec.save, save_interval=spec.save_interval, async_save=spec.async_save,
                          load=spec.load, saves=saves, loads=loads, latest=first.latest,
                          restarts=first.restarts + ([first.restart] if first.restart else []))
    if saves:
        stalls = [s.stall_s for s in saves if s.stall_s is not None]  # each merged save's: _merge_save sets it
        stall = statistics.median(stalls)
        rates = [s.gb_per_s for s in saves if s.gb_per_s is not None]
        section.save_bytes, section.save_gb_per_s = saves[-1].bytes, statistics.median(rates) if rates else None
        section.save_stall_s, section.stall_s_total = stall, sum(stalls)
    elif spec.save is not None:
        unmeasured["saves"] = "no save finished"
    if saves and spec.save_interval and median_step_s:
        section.stall_fraction = stall / (spec.save_interval * median_step_s + stall)
        section.stall_s_per_hour = 3600.0 * section.stall_fraction
    else:
        unmeasured["stall_s_per_hour"] = (
            "no --save-interval: one save, after the last step" if spec.save else "no --save"
        )
    if unmeasured:
        section.unmeasured = unmeasured
    return section


def _merge_save(ranks: list[int], saves: Sequence[RankSave]) -> CheckpointOperation:
    """One save over the ranks (``saves``: rank ``ranks[i]``'s is ``saves[i]``): rank 0's iteration
    and whether it was timed, the longest stall, and _merged's figures."""
    return _merged(ranks, saves, iteration=saves[0].iteration, timed=saves[0].timed,
                   stall_s=max(own.stall_s for own in saves))  # the step waits for its slowest rank


def _merge_load(ranks: list[int], loads: Sequence[RankLoad]) -> CheckpointOperation:
    """One load over the ranks (as _merge_save's): rank 0's iteration and folder, and _merged's figures."""
    return _merged(ranks, loads, iteration=loads[0].iteration, path=loads[0].path)


def _merged(ranks: list[int], same: Sequence[RankSave | RankLoad], **first: Any) -> CheckpointOperation:
    """Every rank's own figures, the bytes of all, the slowest rank's time and the GB/s that makes."""
    total, wall = sum(own.bytes for own in same), max(own.wall_time_s for own in same)
    return CheckpointOperation(bytes=total, wall_time_s=wall, gb_per_s=_gb_per_s(total, wall),
                               ranks=[own.part(rank) for rank, own in zip(ranks, same)], **first)


def _gb_per_s(size: int, wall_s: float) -> float | None:
    return size / wall_s / 1e9 if wall_s > 0 else None
