"""One rank of `hwbench collectives`, as torchrun starts it:

    python -m hwbench.fabric.rank

reads what to measure from the launcher's run folder (HWBENCH_RUN_DIR/collectives.json), joins
the process group on the device's collective backend, measures every collective and size (and
the ring, when asked), and gathers every rank's figures on rank 0, which writes them to the run
folder for the launcher. A failure is raised out of the ``@record``-ed entry point, so torchrun's
error file carries it to the launcher. Each rank writes its heartbeat before each measurement:
after a timeout, the rank that never reached the measurement the others are waiting in is named.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
from pathlib import Path
from typing import Any

from hwbench.fabric.collectives import CollectiveSettings, Scope

SETTINGS_FILE = "collectives.json"
COLLECTIVE_TIMEOUT_MARGIN_S = 60


def rank_main() -> None:
    import torch.distributed as dist

    from hwbench.device import select_backend
    from hwbench.engine.distributed import RankEnvironment
    from hwbench.fabric.collectives import scopes
    from hwbench.fabric.measure import measure, measurements_to_make
    from hwbench.files import write_json_atomic
    from hwbench.harness.faults import RESULT_FILE, RUN_DIR_ENV, Fault, Heartbeat

    run_dir = Path(os.environ[RUN_DIR_ENV])
    request = json.loads((run_dir / SETTINGS_FILE).read_text())
    settings = CollectiveSettings.from_dict(request["settings"])
    env = RankEnvironment.from_environ()
    if env is None:
        raise RuntimeError("python -m hwbench.fabric.rank runs under torchrun only (hwbench collectives starts it)")
    backend = select_backend(request["device"])
    backend.prepare_process(env.local_rank, env.local_world_size)
    # past the launcher's --timeout, so that a hung peer is the launcher's to name, not a rank's own timeout
    collective_timeout = datetime.timedelta(seconds=settings.timeout_s + COLLECTIVE_TIMEOUT_MARGIN_S)
    dist.init_process_group(backend.dist_backend, timeout=collective_timeout)
    todo = measurements_to_make(settings, env.world_size)
    hosts: list[Any] = [None] * env.world_size
    dist.all_gather_object(hosts, socket.gethostname())
    subgroups = [_Subgroup.made(scope, env.rank, settings) for scope in scopes(hosts) if scope.groups]
    ring = request.get("ring")
    steps = len(todo) + sum(len(subgroup.todo) for subgroup in subgroups)
    fault = Fault.from_environ(env.world_size, steps + (env.world_size if ring else 0))
    heartbeat = Heartbeat(env.rank, str(run_dir))
    try:
        rows, step = [], 0
        for step, (collective, in_place, _size, elements) in enumerate(todo, start=1):
            _before(fault, heartbeat, env.rank, step, collective.name, in_place, elements, "")
            rows.append(measure(collective, in_place, elements, settings, backend, env.rank, env.world_size).__dict__)
        scoped = {}
        for subgroup in subgroups:
            scoped[subgroup.scope] = subgroup.measure(settings, backend, env.rank, step, fault, heartbeat)
            step += len(subgroup.todo)
        ring_times = _ring(ring, backend, env.rank, env.world_size, steps, heartbeat, fault) if ring else {}
        mine = {"rank": env.rank, "host": socket.gethostname(), "pid": os.getpid(), "rows": rows,
                "scopes": scoped, "ring": ring_times}
        gathered: list[Any] | None = [None] * env.world_size if env.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if gathered is not None:
            write_json_atomic(run_dir / RESULT_FILE, {"ranks": gathered, "device_names": backend.device_names()})
    except Exception as error:
        # the moment this rank failed: the launcher names the first to fail (its peers fail after it,
        # their collective broken), as for runs (harness/launcher.py root_cause)
        heartbeat.fail("failed", f"{type(error).__name__}: {error}")
        raise
    finally:
        dist.destroy_process_group()


def _before(fault, heartbeat, rank: int, step: int, name: str, in_place: bool, elements: int, where: str) -> None:
    if fault:  # before the heartbeat: a rank that hangs here is seen behind the others
        fault.maybe_trigger(rank, step)
    heartbeat.step(step, f"{name} {'in' if in_place else 'out of'} place, {elements} elements{where}")


@dataclasses.dataclass
class _Subgroup:
    """This rank's part in one scope of a multi-node run (hwbench.fabric.collectives.scopes): the
    process group it measures in (None: not a member, it waits), and the measurements to make."""

    scope: str
    groups: list[list[int]]
    group: Any
    ranks: list[int]  # of this rank's group; [] when it is in none
    todo: list

    @classmethod
    def made(cls, scope: Scope, rank: int, settings: CollectiveSettings) -> _Subgroup:
        import torch.distributed as dist

        from hwbench.fabric.measure import measurements_to_make

        mine, ranks = None, []
        for members in scope.groups:  # every rank makes every group, in the same order (torch's rule)
            group = dist.new_group(members)
            if rank in members:
                mine, ranks = group, members
        return cls(scope.name, scope.groups, mine, ranks, measurements_to_make(settings, len(scope.groups[0])))

    def measure(self, settings: CollectiveSettings, backend, rank: int, step: int, fault, heartbeat) -> list | None:
        """This rank's rows in its group, or None when it is in none (it waits for the members)."""
        import torch.distributed as dist

        from hwbench.fabric.measure import measure

        rows = None
        if self.group is not None:
            rows = []
            for offset, (collective, in_place, _size, elements) in enumerate(self.todo, start=1):
                _before(fault, heartbeat, rank, step + offset, collective.name, in_place, elements, f", {self.scope}")
                rows.append(measure(collective, in_place, elements, settings, backend, self.ranks.index(rank),
                                    len(self.ranks), self.group).__dict__)
        else:  # not behind: where the members are, or a hung member would not be the rank named
            heartbeat.step(step + len(self.todo), f"waiting for the {self.scope} measurements of {self.groups}")
        dist.barrier()
        return rows


def _ring(ring: dict, backend, rank: int, world: int, steps_before: int, heartbeat, fault) -> dict[int, float]:
    from hwbench.fabric.ring import RingSettings, measure_ring

    def before_pair(index: int) -> None:
        if fault and fault.kind != "slow":
            fault.maybe_trigger(rank, steps_before + index + 1)
        heartbeat.step(steps_before + index + 1, f"ring pair {index} -> {(index + 1) % world}")

    def inside_timing(index: int) -> None:  # a slowed rank is slow on both its pairs, as it sends and as it answers
        if fault and fault.kind == "slow":
            fault.maybe_trigger(rank, steps_before + index + 1)

    return measure_ring(RingSettings(**ring), backend, rank, world, before_pair, inside_timing)


def main() -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    from hwbench.lifeline import hold

    hold()  # die with torchrun's agent
    record(rank_main)()


if __name__ == "__main__":
    main()
