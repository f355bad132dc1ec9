"""The slow links: a ring of pairwise send/recv (rank i sends to rank i+1, which sends it back), one
pair at a time while the other ranks wait, so that each pair's time is its own link's. Every pair
slower than the median of the other pairs by more than a threshold is named: a slow rank (its NIC,
its PCIe switch) is on two pairs of the ring, the one it receives on and the one it sends on, and
both are named."""

from __future__ import annotations

import dataclasses
import functools
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
    heartbeat, a fault); ``inside_timing(index)`` on both ranks of the pair inside the sender's
    timed window (a slowed rank, for tests: its two pairs slow down, as a slow rank's would)."""
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
            _echo(outgoing, incoming, sender, settings, backend, functools.partial(inside_timing, index))
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


def _echo(outgoing: torch.Tensor, incoming: torch.Tensor, peer: int, settings: RingSettings, backend: Backend,
          inside_timing: Callable[[], None]) -> None:
    for call in range(settings.warmup + settings.iterations):
        if call == settings.warmup:  # the sender's clock runs from here: a delay here is the pair's
            inside_timing()
        dist.recv(incoming, peer)
        dist.send(outgoing, peer)
    backend.synchronize()
