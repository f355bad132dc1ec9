"""The slow link: a ring of pairwise send/recv (rank i sends to rank i+1, which sends it back), one
pair at a time while the other ranks wait, so that each pair's time is its own link's. The slowest
pair is named when it is slower than the median of the other pairs by more than a threshold."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from hwbench.device.base import Backend
from hwbench.fabric.collectives import ELEMENT_BYTES


@dataclasses.dataclass(frozen=True)
class RingSettings:
    size_bytes: int
    warmup: int
    iterations: int
    threshold: float  # 0.25: a pair 25% slower than the median of the others is named


def pairs(world: int) -> list[tuple[int, int]]:
    """(sender, receiver) of each link of the ring, in the order they are measured."""
    return [(rank, (rank + 1) % world) for rank in range(world)]


def measure_ring(settings: RingSettings, backend: Backend, rank: int, world: int,
                 before_pair: Callable[[int], None], inside_timing: Callable[[int], None]) -> dict[int, float]:
    """One-way seconds of each pair this rank sent on, by pair index (one entry, or none on a rank
    that sends on no pair). ``before_pair(index)`` runs on every rank before each pair (the
    heartbeat, a fault); ``inside_timing(index)`` on the sender inside its timed loop (a slowed
    link, for tests)."""
    elements = settings.size_bytes // ELEMENT_BYTES  # at least one: the command checks --ring-bytes
    outgoing = torch.ones(elements, device=backend.torch_device)
    incoming = torch.empty(elements, device=backend.torch_device)
    times: dict[int, float] = {}
    for index, (sender, receiver) in enumerate(pairs(world)):
        before_pair(index)
        dist.barrier()  # the pair runs alone: the others wait here
        if rank == sender:
            slowed = functools.partial(inside_timing, index)
            times[index] = _ping_pong(outgoing, incoming, receiver, settings, backend, slowed)
        elif rank == receiver:
            _echo(outgoing, incoming, sender, settings.warmup + settings.iterations, backend)
    dist.barrier()
    return times


def _ping_pong(outgoing: torch.Tensor, incoming: torch.Tensor, peer: int, settings: RingSettings, backend: Backend,
               inside_timing: Callable[[], None]) -> float:
    for _ in range(settings.warmup):
        dist.send(outgoing, peer)
        dist.recv(incoming, peer)
    backend.synchronize()
    start = time.perf_counter()
    inside_timing()
    for _ in range(settings.iterations):
        dist.send(outgoing, peer)
        dist.recv(incoming, peer)
    backend.synchronize()
    return (time.perf_counter() - start) / (2 * settings.iterations)


def _echo(outgoing: torch.Tensor, incoming: torch.Tensor, peer: int, calls: int, backend: Backend) -> None:
    for _ in range(calls):
        dist.recv(incoming, peer)
        dist.send(outgoing, peer)
    backend.synchronize()


def slowest_link(times_s: list[float], threshold: float) -> tuple[int | None, float | None, float]:
    """(index of the slowest pair or None when it is within the threshold, its slowdown against the
    median of the other pairs, the median of all pairs)."""
    median_all = statistics.median(times_s)
    if len(times_s) < 2:
        return None, None, median_all
    slowest = max(range(len(times_s)), key=times_s.__getitem__)
    others = statistics.median(t for i, t in enumerate(times_s) if i != slowest)
    slowdown = times_s[slowest] / others - 1 if others > 0 else None
    named = slowest if slowdown is not None and slowdown > threshold else None
    return named, slowdown, median_all
