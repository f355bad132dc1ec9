"""A mixture-of-experts run's routing in its result: each step's figures (``steps[].moe_*``) and
the timed steps' summary (``metrics.routing``), from the per-step, per-layer counts the worker
gathered after its timed loop (hwbench.workload.moe.RoutingRecorder: assignments per expert,
assignments dropped, the mean load-balancing loss)."""

from __future__ import annotations

import dataclasses
import statistics

from hwbench.result.model import MoeRouting
from hwbench.workload.config import GPTConfig

StepCounts = list[list[float]]  # one step: per MoE layer [assignments per expert..., dropped, aux loss]


@dataclasses.dataclass(frozen=True)
class StepRouting:
    aux_loss: float  # the load-balancing loss added to the objective: summed over layers, mean of micro-batches
    imbalance: float | None  # the busiest expert's assignments over the mean, in the worst layer
    dropped_tokens: int  # assignments over capacity, every layer


def imbalance(tokens_per_expert: list[float]) -> float | None:
    """max / mean of one layer's assignments per expert: 1 when balanced, up to E / k; None when
    nothing was routed."""
    mean = sum(tokens_per_expert) / len(tokens_per_expert)
    return max(tokens_per_expert) / mean if mean > 0 else None


def step_routing(step: StepCounts) -> StepRouting:
    layers = [imbalance(layer[:-2]) for layer in step]
    known = [figure for figure in layers if figure is not None]
    return StepRouting(aux_loss=sum(layer[-1] for layer in step), imbalance=max(known) if known else None,
                       dropped_tokens=round(sum(layer[-2] for layer in step)))


def routing_summary(steps: list[StepCounts], timed_from: int, config: GPTConfig) -> MoeRouting:
    """The timed steps' routing (steps from index ``timed_from`` on): assignments per expert and
    drops summed, the step imbalance's median and maximum, the mean load-balancing loss."""
    timed = steps[timed_from:]
    per_step = [step_routing(step) for step in timed]
    layers = len(timed[0]) if timed else 0
    tokens = [[round(sum(step[layer][expert] for step in timed)) for expert in range(len(timed[0][layer]) - 2)]
              for layer in range(layers)]
    imbalances = [figure.imbalance for figure in per_step if figure.imbalance is not None]
    routed = sum(sum(layer) for layer in tokens)
    dropped = sum(figure.dropped_tokens for figure in per_step)
    return MoeRouting(moe_layers=config.moe_layers, experts=config.num_experts, top_k=config.moe_router_topk,
                   tokens_per_expert=tokens, imbalance_median=statistics.median(imbalances) if imbalances else None,
                   imbalance_max=max(imbalances) if imbalances else None, dropped_tokens=dropped,
                   dropped_fraction=dropped / routed if routed else None,
                   aux_loss_mean=statistics.fmean(f.aux_loss for f in per_step) if per_step else None)
