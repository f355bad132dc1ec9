"""Expert parallelism: each MoE layer's experts split over the ep ranks of a group, tokens sent to
their expert's rank and back by all-to-all, as torchtitan's ExpertParallel does it
(torchtitan/distributed/expert_parallel.py) and Megatron-LM's MoEAlltoAllTokenDispatcher.

``apply_expert_parallel`` works on the model on the meta device, before FSDP2 and before the
weights exist: each expert projection's [E, out, in] weight becomes a DTensor sharded on the
experts (Shard(0)) over the "ep" mesh dimension, so rank r of a group holds experts
r E/ep to (r + 1) E/ep - 1 and hwbench.workload.model.init_parameters gives it exactly the
values those experts have on one device. The MoE layer (hwbench.workload.moe.MoE) is not
changed: its experts module takes the rows of this rank's tokens sorted by expert and the
offsets where each expert's rows end; hooks around that module turn them into the rows this
rank's experts receive from every rank of its group and back.

Dispatch, for the rows one rank routes (Megatron's and torchtitan's steps):

    1. rows per expert (from the offsets) to every rank of the group: one all-to-all of E counts
    2. the split sizes on the host (what each rank sends and receives): the one host wait of
       expert parallelism, as torch's all_to_all_single takes them as integers (torchtitan and
       Megatron wait there too)
    3. the rows to their experts' ranks: all-to-all with those splits
    4. the received rows, ordered (source rank, expert), regrouped by expert for the grouped GEMM

Combine is the way back: the expert outputs in (source rank, expert) order, the reverse
all-to-all, and zero rows for the assignments the capacity dropped (they follow every kept row).
Both all-to-alls carry gradients (their backward is the opposite all-to-all), so each expert's
weight gradient holds every token of the group that chose it.

Gradients: the experts' over the "edp" group (the ranks holding the same experts), the rest over
all of "dp" (hwbench.engine.native), both divided by dp, as the loss is a mean over the global batch.

The time spent in the all-to-alls of each training step is measured by ``AllToAllClock``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hwbench.device.base import StepTimer
from hwbench.workload.moe import GroupedExperts, GroupedLinear, MoE, moe_layers, outside_compile


class AllToAllClock:
    """The time each training step spends inside the expert-parallel all-to-alls, read without
    making the host wait: the backend's step timer (device events on an accelerator, recorded in
    the compute stream before and after each collective; the host clock on the CPU, where gloo's
    all-to-all returns when it is done) marks each call's start and end. A step's events are
    read once they have completed (``StepTimer.ready``, no wait) or after the timed loop."""

    def __init__(self, make_timer: Callable[[], StepTimer]):
        self._make_timer = make_timer
        self._current = make_timer()
        self._pending: list[StepTimer] = []  # finished steps whose events may still be running
        self._seconds: list[float] = []  # per finished step, in order

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        self._current.mark()
        try:
            yield
        finally:
            self._current.mark()

    def step_done(self) -> None:
        """Close the step: its calls are kept apart from the next step's."""
        self._pending.append(self._current)
        self._current = self._make_timer()
        while self._pending and self._pending[0].ready():
            self._seconds.append(_inside(self._pending.pop(0)))

    def step_seconds(self) -> list[float]:
        """Seconds in all-to-alls, per step since the start (warm-up included); called after the
        device is synchronised."""
        self._seconds += [_inside(timer) for timer in self._pending]
        self._pending = []
        return list(self._seconds)


def _inside(timer: StepTimer) -> float:
    """The sum of the intervals from each start mark to its end mark (marks come in pairs)."""
    return sum(timer.intervals_s()[0::2])


class _AllToAll(torch.autograd.Function):
    """all_to_all_single of rows with split sizes, whose backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, receive: list[int], send: list[int], group: Any,
                clock: AllToAllClock | None) -> torch.Tensor:
        ctx.receive, ctx.send, ctx.group, ctx.clock = receive, send, group, clock
        return _exchange(rows, receive, send, group, clock)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _exchange(grad, ctx.send, ctx.receive, ctx.group, ctx.clock), None, None, None, None


def _exchange(rows: torch.Tensor, receive: list[int], send: list[int], group: Any,
              clock: AllToAllClock | None) -> torch.Tensor:
    """``rows`` split by ``send`` to the group's ranks in order; ``receive[j]`` rows back from rank j."""
    received = rows.new_empty((sum(receive), *rows.shape[1:]))
    with clock.timing() if clock is not None else contextlib.nullcontext():
        dist.all_to_all_single(received, rows.contiguous(), receive, send, group=group)
    return received


@dataclasses.dataclass
class _Sent:
    """What combine needs of the dispatch it undoes."""

    order: torch.Tensor  # the received rows' positions, by expert
    send: list[int]  # rows this rank sent to each rank of the group
    receive: list[int]  # rows it received from each
    rows: int  # the rows the experts module was given (kept, then dropped)


class ExpertParallelDispatch:
    """The forward pre-hook and forward hook of one MoE layer's experts module (module doc)."""

    def __init__(self, group: Any, ep: int, num_experts: int, clock: AllToAllClock | None):
        self.group, self.ep, self.local_experts = group, ep, num_experts // ep
        self.clock = clock
        self._sent: _Sent | None = None

    # Outside torch.compile (--compile compiles each block): the split sizes are host integers and the
    # clock reads the host's; compiled, they would break the graph anyway, and recompile on every split.
    @outside_compile
    def dispatch(self, module: nn.Module, args: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        rows, offsets = args  # (T k, h) sorted by expert; (E,) int32 ends of each expert's rows
        clock = self.clock if module.training else None  # validation's all-to-alls are no step's
        ends = offsets.long()
        counts = torch.cat([ends[:1], ends[1:] - ends[:-1]])  # (E,) rows for each expert
        # (E,): [rows from rank 0 for my expert 0, 1, ...; from rank 1 for my expert 0, ...]
        received = counts.new_empty(counts.shape)
        with clock.timing() if clock is not None else contextlib.nullcontext():
            dist.all_to_all_single(received, counts, group=self.group)
        by_rank = torch.stack([counts.view(self.ep, -1).sum(1), received.view(self.ep, -1).sum(1)])
        send, receive = by_rank.tolist()  # the one host wait (module doc)
        kept = sum(send)
        routed = _AllToAll.apply(rows[:kept], receive, send, self.group, clock)
        # received rows come in (source rank, expert) segments; the grouped GEMM wants them by expert
        segments = torch.arange(received.numel(), device=received.device)
        segment_of_row = torch.repeat_interleave(segments, received, output_size=sum(receive))
        source, expert = segment_of_row // self.local_experts, segment_of_row % self.local_experts
        order = torch.argsort(expert * self.ep + source, stable=True)
        local_offsets = received.view(self.ep, self.local_experts).sum(0).cumsum(0).to(torch.int32)
        self._sent = _Sent(order=order, send=send, receive=receive, rows=rows.shape[0])
        return routed[order], local_offsets

    @outside_compile
    def combine(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        sent, self._sent = self._sent, None
        assert sent is not None, "combine follows the dispatch of the same call"
        by_source = torch.empty_like(output).index_copy(0, sent.order, output)
        clock = self.clock if module.training else None
        returned = _AllToAll.apply(by_source, sent.send, sent.receive, self.group, clock)
        dropped = returned.new_zeros((sent.rows - returned.shape[0], *returned.shape[1:]))
        return torch.cat([returned, dropped])


def expert_weights(experts: GroupedExperts) -> list[GroupedLinear]:
    """The modules holding an experts module's [E, out, in] weights."""
    return [experts.gate_proj, experts.up_proj, experts.down_proj]


def apply_expert_parallel(model: nn.Module, ep_mesh: Any, clock: AllToAllClock | None) -> None:
    """Shard every MoE layer's experts over ``ep_mesh`` (1-D, the "ep" dimension) and put the
    all-to-all dispatch around them (module doc); on the meta model."""
    from torch.distributed.tensor import Shard, distribute_tensor

    group, ep = ep_mesh.get_group(), ep_mesh.size()
    for layer in moe_layers(model):
        experts = layer.experts
        for linear in expert_weights(experts):
            weight: torch.Tensor = linear.weight
            linear.weight = nn.Parameter(distribute_tensor(weight, ep_mesh, [Shard(0)]))
        hooks = ExpertParallelDispatch(group, ep, layer.router.num_experts, clock)
        experts.register_forward_pre_hook(hooks.dispatch)
        experts.register_forward_hook(hooks.combine)


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: the identity forward; the backward sums the
    input's gradient over the tensor-parallel ranks (each holds the part its share of every
    expert's width contributes)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: the forward sums the ranks' partial
    outputs; the backward is the identity (each rank's part needs the whole output's gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return grad, None


def apply_expert_tensor_parallel(layer: MoE, tp_mesh: Any) -> None:
    """Tensor parallelism of one MoE layer (Megatron's expert tensor parallelism at the TP degree,
    torchtitan's TP of GroupedExperts), on the meta model: every rank holds every expert, each
    expert's width f split over the tp ranks as a dense MLP's is (gate and up column-parallel:
    Shard(1) of [E, f, h]; down row-parallel: Shard(2) of [E, h, f]). The layer's input is whole on
    every tp rank (the attention's row-parallel output), so the router, replicated, routes every
    token alike on each. The experts' partial outputs (T k rows) are summed over tp before the
    combine weighs them by the router's probabilities, as Megatron's token dispatcher reduces them
    before unpermuting: summed after, each rank's gradient of the probabilities, and so of the
    router and of the input through it, would be its part's alone. Their input's gradient is summed
    once in the backward (T x h). The shared experts are a dense MLP: Megatron's split, with its
    own all-reduce."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    group = tp_mesh.get_group()
    for linear, placement in zip(expert_weights(layer.experts), (Shard(1), Shard(1), Shard(2)), strict=True):
        weight: torch.Tensor = linear.weight
        linear.weight = nn.Parameter(distribute_tensor(weight, tp_mesh, [placement]))
    router_weight: torch.Tensor = layer.router.weight
    layer.router.weight = nn.Parameter(distribute_tensor(router_weight, tp_mesh, [Replicate()]))
    layer.to_experts = _tensor_parallel_copy(group)
    layer.from_experts = _tensor_parallel_sum(group)
    if layer.shared_experts is not None:
        parallelize_module(layer.shared_experts, tp_mesh, {
            "gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(), "down_proj": RowwiseParallel()})


def _tensor_parallel_copy(group: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    @outside_compile  # a collective in an autograd function: eager, as the expert-parallel dispatch
    def copy(x: torch.Tensor) -> torch.Tensor:
        return _CopyToTensorParallel.apply(x, group)
    return copy


def _tensor_parallel_sum(group: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    @outside_compile
    def total(x: torch.Tensor) -> torch.Tensor:
        return _ReduceFromTensorParallel.apply(x, group)
    return total


def expert_parameter_names(model: nn.Module) -> list[str]:
    """The names of the experts' weights in ``model`` (their gradients are reduced apart)."""
    experts = {id(layer.experts) for layer in moe_layers(model)}
    return [f"{name}.{parameter_name}" for name, module in model.named_modules() if id(module) in experts
            for parameter_name, _ in module.named_parameters()]


def apply_expert_fsdp(model: nn.Module, edp_mesh: Any, reshard_after_forward: bool) -> None:
    """FSDP2 of the experts over the ranks that hold the same ones (``edp_mesh``), before the
    blocks' FSDP2 over all of dp takes the rest (torchtitan's order). FSDP2 averages their
    gradients over the edp ranks; the mean over the global batch divides the edp sum by dp, as
    each rank's expert gradient already sums the tokens of its whole ep group (the all-to-all's
    backward): the engine scales them by edp / dp = 1 / ep after the backward
    (``scale_expert_gradients``). torchtitan sets FSDP2's divide factor to dp instead, which
    reduces with PREMUL_SUM: NCCL has it, gloo does not."""
    from torch.distributed.fsdp import fully_shard

    for layer in moe_layers(model):
        fully_shard(layer.experts, mesh=edp_mesh, reshard_after_forward=reshard_after_forward)
