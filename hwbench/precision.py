"""The precisions a run trains in, and what FP8 is made of (docs/methodology.md, "FP8 training").

fp32, bf16 and fp16 are the dtypes autocast runs in; every device catalog entry lists a peak of
each. fp8 is a recipe rather than a dtype: torchao's float8 training of the transformer blocks'
linear layers (hwbench.engine.float8), everything else as a bf16 run (bf16 autocast, fp32 master
weights, the same AdamW). Torch-free, so that the options, the catalog and the spec read it
without importing torch.
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16", "fp16")  # autocast's dtypes; every device entry lists a peak of each
FP8 = "fp8"
RUN_PRECISIONS = (*PRECISIONS, FP8)  # what --precision takes
# --fp8-recipe: torchao's Float8LinearConfig.from_recipe_name names (tensorwise: one scale per
# tensor; rowwise: one per row, scales rounded to powers of 2) and MXFP8 (blocks of 32 elements
# with an e8m0 scale each, torchao's MXFP8TrainingOpConfig; the matrix units of NVIDIA Blackwell)
FP8_RECIPES = ("tensorwise", "rowwise", "mxfp8")
BLOCK_SCALED_RECIPES = ("mxfp8",)  # those that need the MX formats' matrix units (Backend.fp8_units)
DEFAULT_FP8_RECIPE = "tensorwise"  # torchao's default Float8LinearConfig(), torchtitan's when no recipe is named
# What an FP8 run computes outside its FP8 GEMMs (autocast), and the peak its MFU is stated against:
# the BF16 dense peak, as Megatron-Bridge and torchtitan report the MFU of FP8 runs
FP8_HIGH_PRECISION = "bf16"


def peak_precision(precision: str) -> str:
    """The catalog peak a run's MFU is stated against (fp8: the BF16 dense peak)."""
    return FP8_HIGH_PRECISION if precision == FP8 else precision
