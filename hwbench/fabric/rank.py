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

import datetime
import json
import os
import socket
from pathlib import Path
from typing import Any

from hwbench.fabric.collectives import CollectiveSettings

SETTINGS_FILE = "collectives.json"
COLLECTIVE_TIMEOUT_MARGIN_S = 60


def rank_main() -> None:
    import torch.distributed as dist

    from hwbench.device import select_backend
    from hwbench.engine.distributed import RankEnvironment
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
    ring = request.get("ring")
    fault = Fault.from_environ(env.world_size, len(todo) + (env.world_size if ring else 0))
    heartbeat = Heartbeat(env.rank, str(run_dir))
    try:
        rows = []
        for step, (collective, in_place, _size, elements) in enumerate(todo, start=1):
            if fault:  # before the heartbeat: a rank that hangs here is seen behind the others
                fault.maybe_trigger(env.rank, step)
            heartbeat.step(step, f"{collective.name} {'in' if in_place else 'out of'} place, {elements} elements")
            rows.append(measure(collective, in_place, elements, settings, backend, env.rank, env.world_size).__dict__)
        ring_times = _ring(ring, backend, env.rank, env.world_size, len(todo), heartbeat, fault) if ring else {}
        mine = {"rank": env.rank, "host": socket.gethostname(), "pid": os.getpid(), "rows": rows,
                "ring": ring_times}
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
