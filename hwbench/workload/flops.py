"""FLOPs per training iteration: the one place hwbench computes them.

TFLOP/s and MFU everywhere in hwbench come from ``model_flops_per_iteration``;
the result records which formula was used, and every known formula's figures
beside it (``metrics.by_formula``), so a run compares with a Megatron-LM log of
either generation or with Megatron-DeepSpeed (docs/methodology.md, "FLOPs"). A formula that
counts the recompute's extra forward (``counts_recompute``) counts hardware FLOPs for a run that
recomputes: its utilisation is shown as HFU there (``utilisation_label``), MFU elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hwbench.workload.config import GPTConfig
from hwbench.workload.params import count_parameters


@dataclasses.dataclass(frozen=True)
class FlopsFormula:
    name: str
    source: str
    expression: str
    # (config, global batch, seq length, padded vocab, recompute counted) -> FLOPs per iteration
    compute: Callable[[GPTConfig, int, int, int, bool], float]
    # Whether the count includes activation recomputation's extra forward pass: then, for a run
    # that recomputes, it counts hardware FLOPs and its utilisation is HFU, not MFU (model FLOPs
    # utilisation, which recomputation does not raise). Every formula says so here, the one place.
    counts_recompute: bool


def _megatron(attention: int, output: int) -> Callable[[GPTConfig, int, int, int, bool], float]:
    """Megatron's count, 24*f*B*s*L*h^2*(1 + s/(attention*h) + V/(output*L*h)): f = 3 passes (forward,
    wgrad, dgrad), 4 with the recomputed forward where the formula counts it (Megatron-DeepSpeed's
    megatron/utils.py throughput_calculator: checkpoint_activations_factor = 4 if
    args.checkpoint_activations else 3). ``attention`` 12: causal attention computes only half the
    score matrix and multiplies it with V; 6: the full matrix."""

    def compute(config: GPTConfig, batch: int, seq: int, vocab: int, recompute: bool) -> float:
        L, h = config.num_layers, config.hidden_size
        return 24.0 * (4 if recompute else 3) * batch * seq * L * h * h * (1 + seq / (attention * h)
                                                                            + vocab / (output * L * h))

    return compute


def _palm(config: GPTConfig, batch: int, seq: int, vocab: int, recompute: bool) -> float:
    n = count_parameters(config).non_embedding
    L, H, Q = config.num_layers, config.num_attention_heads, config.head_dim
    return float(batch * seq * (6 * n + 12 * L * H * Q * seq))


FLOPS_FORMULAS: dict[str, FlopsFormula] = {
    f.name: f
    for f in (
        FlopsFormula(
            name="megatron-core-v0.12",
            source="Megatron-LM core_v0.12.0 and later (main included), num_floating_point_operations in "
                   "megatron/training/training.py, plain GPT: the attention scores counted once for the causal "
                   "mask (s/(2h) in its general form)",
            expression="72*B*s*L*h^2*(1 + s/(12h) + V/(12*L*h))",
            compute=_megatron(12, 12),
            counts_recompute=False,  # expansion factor 3 (forward, wgrad, dgrad): no recompute term
        ),
        FlopsFormula(
            name="megatron-core-v0.7",
            source="Megatron-LM core_v0.5.0 to core_v0.11.x, num_floating_point_operations in megatron/training.py "
                   "(from core_v0.6.0 megatron/training/training.py), plain GPT: the full attention-score matrix",
            expression="72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h))",
            compute=_megatron(6, 12),
            counts_recompute=False,
        ),
        FlopsFormula(
            name="megatron-deepspeed",
            source="Megatron-DeepSpeed throughput_calculator (hardware FLOPs when recomputing)",
            expression="24*f*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)), f = 4 with recompute else 3",
            compute=_megatron(6, 16),
            counts_recompute=True,
        ),
        FlopsFormula(
            name="palm",
            source="PaLM appendix B / nanoGPT estimate_mfu",
            expression="B*s*(6*N + 12*L*H*Q*s), N = non-embedding parameters",
            compute=_palm,
            counts_recompute=False,  # PaLM's MFU leaves rematerialisation out by definition
        ),
    )
}

DEFAULT_FLOPS_FORMULA = "megatron-core-v0.12"
# Names accepted on input for a formula: the old name of megatron-core-v0.7 (suites written
# before it was split by Megatron version). Results record the canonical name.
FLOPS_FORMULA_ALIASES = {"megatron-lm": "megatron-core-v0.7"}
FLOPS_FORMULA_NAMES = (*FLOPS_FORMULAS, *FLOPS_FORMULA_ALIASES)  # what --flops-formula accepts


def canonical_formula(name: str) -> str:
    """The formula's canonical name (an alias resolved); ValueError for an unknown one."""
    name = FLOPS_FORMULA_ALIASES.get(name, name)
    if name not in FLOPS_FORMULAS:
        raise ValueError(f"unknown FLOPs formula {name!r}; known: {', '.join(FLOPS_FORMULA_NAMES)}")
    return name


def counts_hardware_flops(formula: str | None, recompute: bool | None) -> bool:
    """Whether a figure counted by ``formula`` for a run that recomputes (``recompute``) or not
    counts hardware FLOPs: the formula adds the recompute's extra forward and the run recomputes.
    Its utilisation is then HFU, not MFU. An unknown or missing formula: False (nothing to say)."""
    if not recompute or not isinstance(formula, str):
        return False
    formula = FLOPS_FORMULA_ALIASES.get(formula, formula)
    return formula in FLOPS_FORMULAS and FLOPS_FORMULAS[formula].counts_recompute


def utilisation_label(formula: str | None, recompute: bool | None) -> str:
    """"HFU" for a utilisation of hardware FLOPs (counts_hardware_flops), else "MFU"."""
    return "HFU" if counts_hardware_flops(formula, recompute) else "MFU"


def hfu_reason(formula: str) -> str:
    """Why a figure of ``formula`` (one that counts recompute) reads HFU for a run that recomputes."""
    name = FLOPS_FORMULA_ALIASES.get(formula, formula)
    return (f"HFU, not MFU: the {name} formula counts activation recomputation's extra forward pass "
            f"({FLOPS_FORMULAS[name].expression}), so for a run that recomputes it is hardware FLOPs "
            "utilisation, higher than the model FLOPs utilisation of the same speed; compare it with "
            "HFU, not with MFU")


def model_flops_per_iteration(
    config: GPTConfig,
    global_batch_size: int,
    seq_length: int,
    *,
    tensor_parallel: int = 1,
    recompute: bool = False,
    formula: str = DEFAULT_FLOPS_FORMULA,
) -> float:
    """FLOPs of one training iteration (forward and backward over the global batch).

    The Megatron-LM formulas (the default among them) and palm count model FLOPs: recomputation
    does not add to them, so MFU stays comparable with and without activation checkpointing.
    megatron-deepspeed counts the recompute (``FlopsFormula.counts_recompute``): hardware FLOPs.
    """
    counted = FLOPS_FORMULAS[canonical_formula(formula)]
    vocab = config.padded_vocab_size(tensor_parallel)
    return counted.compute(config, global_batch_size, seq_length, vocab, recompute and counted.counts_recompute)


def flops_by_formula(config: GPTConfig, global_batch_size: int, seq_length: int, *, tensor_parallel: int = 1,
                     recompute: bool = False) -> dict[str, float]:
    """Every known formula's FLOPs of one iteration, by canonical name."""
    return {name: model_flops_per_iteration(config, global_batch_size, seq_length, tensor_parallel=tensor_parallel,
                                            recompute=recompute, formula=name) for name in FLOPS_FORMULAS}


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of one (m x k) @ (k x n) matrix product: a multiply and an add per term
    (2mnk), the count the model formulas use, so a measured GEMM rate (hwbench calibrate)
    and a run's TFLOP/s are in the same units."""
    return 2 * m * n * k
