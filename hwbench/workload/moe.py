"""The mixture-of-experts MLP of Mixtral and Qwen3-MoE as Megatron-LM's MoE switches shape it
(GPTConfig's num_experts and moe_* fields): a top-k router, routed SwiGLU experts, optional shared
experts every token passes through, Megatron's load-balancing loss, dropless routing or a capacity
per expert.

Stages, each a function of plain tensors so that expert parallelism can put its all-to-all between
``dispatch`` and the experts and ``combine`` after them:

    route     router scores (softmax or sigmoid), each token's top k experts and their weights,
              the capacity drop, the auxiliary loss                          -> Routing
    dispatch  the (token, expert) assignments sorted by expert: the tokens' rows in that order
              and the offsets where each expert's rows end
    experts   one grouped GEMM per projection over every expert at once (F.grouped_mm)
    combine   each token's expert outputs weighted and summed

The experts' weights are one [E, out, in] tensor per projection (gate_proj, up_proj, down_proj, as
torchtitan's GroupedExperts holds them), so sharding experts over ranks is a Shard(0) of each, for
expert parallelism and FSDP2 alike, and splitting each expert's width over tensor-parallel ranks a
Shard of its f dimension. The tokens the routed experts take and the rows they return pass through
``to_experts`` and ``from_experts``, the identity unless tensor parallelism makes them Megatron's conjugate pair
(hwbench.engine.expert_parallel.apply_expert_tensor_parallel). Nothing here waits for the host:
counts and offsets stay on the device (the figures a run records are read after its timed loop: ``RoutingFigures``).

Shapes: T tokens of the micro-batch (B x S), h hidden, E experts, k top-k, f an expert's width.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from hwbench.workload.config import GPTConfig


def outside_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.disable(fn)``, made at the first call: the decorator imports torch._dynamo
    (about a second), which every process importing the model would pay at import, compiling or not.
    Under torch.compile the first call happens while tracing; the disabled function then runs eagerly."""
    disabled: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call


@dataclasses.dataclass
class Routing:
    """The router's decision for T tokens."""

    experts: torch.Tensor  # (T, k) int64: each token's experts
    weights: torch.Tensor  # (T, k) fp32: the weight of each expert's output, 0 where dropped
    kept: torch.Tensor | None  # (T, k) bool: the assignment is within its expert's capacity; None: dropless
    routed: torch.Tensor  # (E,) int64: assignments the router made to each expert, before the capacity
    aux_loss: torch.Tensor  # 0-dim fp32: the load-balancing loss, coefficient applied (0 without one)


class Router(nn.Module):
    """Megatron's TopKRouter: logits = x W^T (W [E, h], no bias), scores by softmax or sigmoid in
    fp32, each token's top k. Softmax's k probabilities are renormalised to sum to 1 (Megatron's
    default, the softmax of the top-k logits: Mixtral, Qwen3-MoE with norm_topk_prob) unless
    ``moe_router_pre_softmax`` keeps them as they are (OLMoE); sigmoid's are renormalised when k > 1
    (DeepSeek-V3)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.num_experts is not None
        self.num_experts, self.top_k = config.num_experts, config.moe_router_topk
        self.score_function, self.pre_softmax = config.moe_router_score_function, config.moe_router_pre_softmax
        self.aux_loss_coeff = config.moe_aux_loss_coeff
        self.capacity_factor = config.moe_expert_capacity_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))

    def forward(self, x: torch.Tensor) -> Routing:  # x (T, h)
        logits = F.linear(x, local(self.weight)).float()  # (T, E)
        if self.score_function == "softmax":
            scores = torch.softmax(logits, dim=-1)
            weights, experts = scores.topk(self.top_k, dim=-1)
            if not self.pre_softmax:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            balance_scores = scores
        else:
            scores = torch.sigmoid(logits)
            weights, experts = scores.topk(self.top_k, dim=-1)
            if self.top_k > 1:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            balance_scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)  # Megatron's, for the loss
        routed = torch.zeros(self.num_experts, dtype=torch.int64, device=x.device).scatter_add_(
            0, experts.flatten(), torch.ones_like(experts.flatten()))
        kept = self._within_capacity(weights, experts) if self.capacity_factor is not None else None
        if kept is not None:
            weights = weights * kept
        aux_loss = (load_balancing_loss(balance_scores, routed, self.top_k, self.aux_loss_coeff)
                    if self.aux_loss_coeff > 0 else logits.new_zeros(()))
        return Routing(experts=experts, weights=weights, kept=kept, routed=routed, aux_loss=aux_loss)

    def _within_capacity(self, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """(T, k) bool: each expert keeps the ``capacity`` assignments of highest weight and drops
        the rest (Megatron's --moe-token-drop-policy probs, without padding); capacity =
        ceil(T k / E x capacity factor), Megatron's get_capacity. Shapes only: no host wait."""
        tokens = weights.shape[0]
        capacity = expert_capacity(tokens, self.top_k, self.num_experts, self.capacity_factor or 0.0)
        if capacity >= tokens:  # no expert can receive more than every token
            return torch.ones_like(experts, dtype=torch.bool)
        gates = torch.zeros(tokens, self.num_experts, device=weights.device).scatter(1, experts, weights)  # (T, E)
        _, keep = gates.topk(capacity, dim=0, sorted=False)  # (capacity, E): each expert's highest weights
        kept_map = torch.zeros_like(gates, dtype=torch.bool).scatter(0, keep, True)
        return kept_map.gather(1, experts)  # an assignment's weight is > 0, so it outranks every token not routed


def expert_capacity(tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Assignments one expert takes from ``tokens`` tokens: Megatron's get_capacity(T k, E, factor)."""
    return math.ceil(tokens * top_k / num_experts * capacity_factor)


def load_balancing_loss(scores: torch.Tensor, routed: torch.Tensor, top_k: int, coeff: float) -> torch.Tensor:
    """Megatron's switch_load_balancing_loss_func (Switch Transformer's loss): coeff x E x
    sum_i f_i P_i, f_i the fraction of the T k assignments routed to expert i, P_i its mean
    score over the T tokens. 1 x coeff when balanced. transformers' load_balancing_loss_func of
    one layer is k times this without the coefficient (its f sums to k)."""
    tokens, num_experts = scores.shape
    return (scores.sum(dim=0) * routed).sum() * (num_experts * coeff / (top_k * tokens * tokens))


class GroupedLinear(nn.Module):
    """E linear maps without bias, one per expert: weight [E, out, in]. forward(x, offsets) maps
    the rows of x that belong to expert e (offsets[e - 1] to offsets[e]) by weight[e]; rows past
    offsets[-1] are left undefined (F.grouped_mm does not write them)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_features, in_features))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # under expert parallelism a DTensor sharded on the experts: this rank's experts, whose rows
        # the dispatch (hwbench.engine.expert_parallel) gives this module; under tensor parallelism
        # sharded on each expert's width: this rank's part of every expert
        weight = local(self.weight)
        if torch.is_autocast_enabled(x.device.type):  # grouped_mm takes one dtype; autocast does not cast it
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
        # the transposed view is the column-major operand the grouped GEMM kernels take
        x, weight_t = x.to(weight.dtype), weight.transpose(-2, -1)
        if weight.dtype == torch.bfloat16:
            return F.grouped_mm(x, weight_t, offs=offsets)
        return _grouped_mm_outside_compile(x, weight_t, offsets)


def local(weight: torch.Tensor) -> torch.Tensor:
    """This rank's part of a weight that expert or tensor parallelism made a DTensor (replicated for
    the router: the whole); the weight itself otherwise. The MoE layer computes on local tensors;
    the parallel layouts say what the parts mean (hwbench.engine.expert_parallel)."""
    return weight.to_local() if isinstance(weight, DTensor) else weight


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


@outside_compile
def _grouped_mm_outside_compile(x: torch.Tensor, weight_t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """F.grouped_mm in fp32 or fp16, run eagerly under torch.compile: torch's meta function for it
    (what compile traces with) takes bf16 only, while the operator itself takes every float type."""
    return F.grouped_mm(x, weight_t, offs=offsets)


class GroupedExperts(nn.Module):
    """E SwiGLU MLPs (Mixtral's experts), inner width f: down(silu(gate(x)) * up(x)) per expert,
    over tokens sorted by expert."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int):
        super().__init__()
        self.gate_proj = GroupedLinear(num_experts, hidden_size, ffn_size)
        self.up_proj = GroupedLinear(num_experts, hidden_size, ffn_size)
        self.down_proj = GroupedLinear(num_experts, ffn_size, hidden_size)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x, offsets)) * self.up_proj(x, offsets), offsets)


class SharedExperts(nn.Module):
    """Megatron's shared experts: one SwiGLU MLP of width moe_shared_expert_intermediate_size that
    every token passes through, added to the routed experts' output."""

    def __init__(self, hidden_size: int, ffn_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, ffn_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, ffn_size, bias=False)
        self.down_proj = nn.Linear(ffn_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclasses.dataclass
class Dispatch:
    """The T k assignments sorted by expert (kept ones first, dropped ones last)."""

    order: torch.Tensor  # (T k,) int64: the assignment (token t's j-th expert is t k + j) at each sorted row
    offsets: torch.Tensor  # (E,) int32: where each expert's rows end (the grouped GEMM's offs)
    kept: torch.Tensor | None  # (T k,) bool per sorted row; None: dropless


def dispatch(routing: Routing) -> Dispatch:
    """Sort the assignments by expert with a stable sort (tokens keep their order within an
    expert); dropped assignments go after every expert's rows, where the grouped GEMM ignores them."""
    experts, num_experts = routing.experts.flatten(), routing.routed.shape[0]
    if routing.kept is None:
        counts, key = routing.routed, experts
    else:
        flat_kept = routing.kept.flatten()
        counts = torch.zeros_like(routing.routed).scatter_add_(0, experts, flat_kept.long())
        key = torch.where(flat_kept, experts, num_experts)
    order = torch.argsort(key, stable=True)
    return Dispatch(order=order, offsets=counts.cumsum(0).to(torch.int32),
                    kept=None if routing.kept is None else routing.kept.flatten()[order])


def combine(expert_rows: torch.Tensor, sorted_rows: Dispatch, routing: Routing) -> torch.Tensor:
    """(T k, h) expert outputs in sorted order -> (T, h): back in assignment order, weighted by
    the router and summed over each token's k experts (in fp32, as transformers' Mixtral
    accumulates them), in the outputs' dtype."""
    tokens, top_k = routing.experts.shape
    unsorted = torch.zeros_like(expert_rows).index_copy(0, sorted_rows.order, expert_rows)
    weighted = unsorted.view(tokens, top_k, -1) * routing.weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(expert_rows.dtype)


class MoE(nn.Module):
    """The MoE MLP of one layer (Megatron's MoELayer): forward (B, S, h) -> (B, S, h).

    In training each forward leaves its load-balancing loss in ``aux_loss`` (with its graph; the
    model adds it to the training loss: hwbench.workload.model.GPT.loss) and adds its routing to
    ``figures``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.num_experts is not None
        self.top_k = config.moe_router_topk
        self.router = Router(config)
        self.experts = GroupedExperts(config.num_experts, config.hidden_size, config.moe_ffn_size)
        shared = config.moe_shared_expert_intermediate_size
        self.shared_experts = SharedExperts(config.hidden_size, shared) if shared else None
        self.aux_loss: torch.Tensor | None = None
        self.figures = RoutingFigures()
        # the routed experts' input and output (module doc): the identity on one rank's whole experts
        self.to_experts: Callable[[torch.Tensor], torch.Tensor] = identity
        self.from_experts: Callable[[torch.Tensor], torch.Tensor] = identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, h = x.shape
        tokens = x.reshape(B * S, h)
        routing = self.router(tokens)
        sorted_rows = dispatch(routing)
        # (T k, h): each assignment's token, by expert
        rows = self.to_experts(tokens)[sorted_rows.order // self.top_k]
        if sorted_rows.kept is not None:  # dropped rows: zero in, and their undefined outputs zeroed
            rows = torch.where(sorted_rows.kept.unsqueeze(-1), rows, 0.0)
        expert_rows = self.from_experts(self.experts(rows, sorted_rows.offsets))
        if sorted_rows.kept is not None:
            expert_rows = torch.where(sorted_rows.kept.unsqueeze(-1), expert_rows, 0.0)
        y = combine(expert_rows, sorted_rows, routing)
        if self.shared_experts is not None:
            y = y + self.shared_experts(tokens)
        if self.training:
            self._record(routing)
        return y.view(B, S, h)

    @outside_compile
    def _record(self, routing: Routing) -> None:
        """Keep this training forward's load-balancing loss for the model's loss and add its routing
        to the figures, unless the forward is activation checkpointing's recomputation (which runs
        inside the backward: the first forward counted it and its loss was taken). Outside
        torch.compile: host-side bookkeeping, which would make a compiled graph recompile."""
        if torch._C._current_graph_task_id() != -1:  # inside a backward: the recomputation
            return
        self.aux_loss = routing.aux_loss
        self.figures.add(routing)


class RoutingFigures:
    """One MoE layer's routing since the last ``take``, summed on the device over its training
    forwards (micro-batches): assignments per expert, assignments dropped, the load-balancing
    loss. Adding launches a few small kernels and never waits for the host."""

    def __init__(self) -> None:
        self._totals: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._forwards = 0

    def add(self, routing: Routing) -> None:
        with torch.no_grad():
            dropped = (routing.kept.numel() - routing.kept.sum() if routing.kept is not None
                       else routing.routed.new_zeros(()))
            figures = (routing.routed, dropped, routing.aux_loss.detach().float())
            self._totals = figures if self._totals is None else tuple(  # type: ignore[assignment]
                total + figure for total, figure in zip(self._totals, figures, strict=True))
            self._forwards += 1

    def take(self, num_experts: int, device: torch.device) -> torch.Tensor:
        """(E + 2,) fp64 on the device: assignments per expert, assignments dropped, the mean
        load-balancing loss over the forwards since the last take (zeros when none ran); resets."""
        if self._totals is None:
            return torch.zeros(num_experts + 2, dtype=torch.float64, device=device)
        routed, dropped, aux_loss = self._totals
        mean_aux_loss = aux_loss.double() / self._forwards
        taken = torch.cat([routed.double(), dropped.double().reshape(1), mean_aux_loss.reshape(1)])
        self._totals, self._forwards = None, 0
        return taken


def moe_layers(model: nn.Module) -> list[MoE]:
    """The MoE layers of a model (or pipeline stage, or wrapped model), in layer order."""
    return [module for module in model.modules() if isinstance(module, MoE)]


class RoutingRecorder:
    """Each training step's routing in every MoE layer of a model, kept on the device until the
    run has timed its steps: ``step_done`` after each optimizer step (a stack of a few small
    tensors, no host wait), ``steps`` after the timed loop."""

    def __init__(self, layers: list[MoE]):
        assert layers, "a model without MoE layers has no routing to record"
        self.layers = layers
        self._steps: list[torch.Tensor] = []

    @classmethod
    def of(cls, model: nn.Module | None) -> RoutingRecorder | None:
        """The recorder of ``model``'s MoE layers; None for a dense model (or none)."""
        layers = moe_layers(model) if model is not None else []
        return cls(layers) if layers else None

    def step_done(self) -> None:
        self._steps.append(torch.stack([layer.figures.take(layer.router.num_experts, layer.router.weight.device)
                                        for layer in self.layers]))

    def steps(self) -> torch.Tensor:
        """(steps, MoE layers, E + 2) fp64 on the device: per step and layer the assignments each
        expert received, the assignments dropped, the mean load-balancing loss (RoutingFigures.take)."""
        return torch.stack(self._steps)
