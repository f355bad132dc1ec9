"""One rank's part of `hwbench collectives`: each collective at each size, timed as nccl-tests
times it (warm-up calls, then timed calls back to back, the device synchronised before and after,
the mean time of one call), then checked as nccl-tests' -c checks it: the buffers filled with a
known pattern again, one more call, every element compared exactly with what it must hold.

The pattern is small integers in float32, so sums over any realistic number of ranks are exact
and an exact comparison is the right one (nccl-tests compares with a tolerance only for
reductions that round)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from hwbench.device.base import Backend
from hwbench.fabric.collectives import COLLECTIVES, ELEMENT_BYTES, Collective, CollectiveSettings, message_elements

# torch 2.13 names them *_single and deprecates the *_tensor names older releases have
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
PATTERN_MODULUS = 251  # values 0..250: a sum over 60,000 ranks stays below float32's exact 2^24


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One rank's figures for one collective, size and placement."""

    collective: str
    in_place: bool
    size_bytes: int
    elements: int
    time_s: float
    wrong: int  # elements that differ from what they must hold (nccl-tests' #wrong); -1: not checked


def pattern(rank: int, elements: int, offset: int = 0) -> torch.Tensor:
    """What rank ``rank`` puts in elements offset..offset+elements of its buffer."""
    index = torch.arange(offset, offset + elements, dtype=torch.int64)
    return ((index * 7 + rank * 13 + 1) % PATTERN_MODULUS).to(torch.float32)


@dataclasses.dataclass
class Call:
    """One collective ready to call: ``run`` makes the call, ``fill`` puts the pattern back in
    its buffers, ``result`` is what the check reads and ``expected`` what it must hold."""

    run: Callable[[], object]
    fill: Callable[[], object]
    result: torch.Tensor
    expected: torch.Tensor


def prepare_call(collective: Collective, in_place: bool, elements: int, rank: int, world: int,
                 device: torch.device, group: dist.ProcessGroup | None = None) -> Call:
    """The buffers and call of ``collective`` with ``elements`` elements (nccl-tests' size), between
    the ranks of ``group`` (the whole world when None); ``rank`` and ``world`` are within it."""
    share = elements // world if collective.divides else elements
    everyone = range(world)

    def global_rank(group_rank: int) -> int:  # send, recv and broadcast name their peers by global rank
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    def buffer(values: torch.Tensor) -> torch.Tensor:
        return values.to(device)

    if collective.name == "all_reduce":
        data = buffer(pattern(rank, elements))
        return Call(lambda: dist.all_reduce(data, group=group), lambda: data.copy_(pattern(rank, elements)), data,
                    torch.stack([pattern(r, elements) for r in everyone]).sum(0))
    if collective.name == "all_gather":
        output = buffer(torch.full((elements,), -1.0))
        given = output.narrow(0, rank * share, share) if in_place else buffer(pattern(rank, share))
        return Call(lambda: ALL_GATHER(output, given, group=group), lambda: given.copy_(pattern(rank, share)),
                    output, torch.cat([pattern(r, share) for r in everyone]))
    if collective.name == "reduce_scatter":
        given = buffer(pattern(rank, elements))
        output = given.narrow(0, rank * share, share) if in_place else buffer(torch.full((share,), -1.0))
        return Call(lambda: REDUCE_SCATTER(output, given, group=group), lambda: given.copy_(pattern(rank, elements)),
                    output, torch.stack([pattern(r, share, rank * share) for r in everyone]).sum(0))
    if collective.name == "all_to_all":
        given = buffer(pattern(rank, elements))
        output = buffer(torch.full((elements,), -1.0))
        # rank k's chunk j is rank j's chunk k
        return Call(lambda: dist.all_to_all_single(output, given, group=group),
                    lambda: given.copy_(pattern(rank, elements)), output,
                    torch.cat([pattern(j, share, rank * share) for j in everyone]))
    if collective.name == "broadcast":
        data = buffer(pattern(rank, elements))
        return Call(lambda: dist.broadcast(data, src=global_rank(0), group=group),
                    lambda: data.copy_(pattern(rank, elements)), data, pattern(0, elements))
    if collective.name == "send_recv":  # nccl-tests' sendrecv: each rank sends to the next, receives from the previous
        given = buffer(pattern(rank, elements))
        output = buffer(torch.full((elements,), -1.0))
        after, before = (rank + 1) % world, (rank - 1) % world

        def exchange() -> None:
            for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, given, global_rank(after), group),
                                                   dist.P2POp(dist.irecv, output, global_rank(before), group)]):
                request.wait()

        return Call(exchange, lambda: given.copy_(pattern(rank, elements)), output, pattern(before, elements))
    raise ValueError(f"unknown collective {collective.name!r}")


def time_call(call: Call, backend: Backend, warmup: int, iterations: int,
              group: dist.ProcessGroup | None = None) -> float:
    """Seconds per call: the mean of ``iterations`` calls back to back after ``warmup`` untimed ones,
    every rank of the group starting together."""
    for _ in range(warmup):
        call.run()
    backend.synchronize()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iterations):
        call.run()
    backend.synchronize()
    return (time.perf_counter() - start) / iterations


def check_call(call: Call, backend: Backend) -> int:
    """Elements that differ from what they must hold after one call on fresh buffers."""
    call.fill()
    call.run()
    backend.synchronize()
    return int((call.result.cpu() != call.expected).sum())


def measurements_to_make(settings: CollectiveSettings, world: int) -> list[tuple[Collective, bool, int, int]]:
    """(collective, in place, size in bytes, elements) of every measurement, in the order every rank
    makes them; sizes that hold no element for this world size are left out."""
    made = []
    for name in settings.collectives:
        collective = COLLECTIVES[name]
        placements = [p for p, has in ((False, collective.out_of_place), (True, collective.in_place)) if has]
        for size in settings.sizes():
            elements = message_elements(collective, size, world)
            if elements:
                made += [(collective, in_place, elements * ELEMENT_BYTES, elements) for in_place in placements]
    return made


def measure(collective: Collective, in_place: bool, elements: int, settings: CollectiveSettings,
            backend: Backend, rank: int, world: int, group: dist.ProcessGroup | None = None) -> Measurement:
    """``rank`` and ``world`` within ``group`` (the whole world when None)."""
    call = prepare_call(collective, in_place, elements, rank, world, backend.torch_device, group)
    seconds = time_call(call, backend, settings.warmup, settings.iterations, group)
    wrong = check_call(call, backend) if settings.check else -1
    return Measurement(collective.name, in_place, call.result.element_size() * elements, elements, seconds, wrong)
