"""FP8 training through torchao (docs/methodology.md, "FP8 training"): which linear layers train
in FP8, and their conversion.

What converts is torchtitan's choice (its float8 converter's module filter): the ``nn.Linear``
layers of the transformer blocks whose two dimensions are multiples of 16 (the FP8 GEMMs'
requirement); the output (vocabulary) layer and every other layer stay in high precision, each
with the reason in the result (``engine.fp8``). tensorwise and rowwise are torchao's
``Float8LinearConfig.from_recipe_name`` recipes, applied by ``convert_to_float8_training`` to the
model while it is still on the meta device, before any parallel wrapping (FSDP2 then shards the
converted layers' high-precision weights, as torchao and torchtitan do); mxfp8 is torchao's
``MXFP8TrainingOpConfig``, which wraps the converted layers' weights and is applied once they
hold values. Everything else of the step is a bf16 run's: bf16 autocast, fp32 master weights, the
same AdamW. torchao is imported here only, and only for an FP8 run.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from torch import nn

FP8_DIVISOR = 16  # an FP8 GEMM's dimensions are multiples of 16 (torch._scaled_mm's requirement)
BLOCK_PREFIX = "blocks."  # the transformer blocks' module names (hwbench.workload.model.GPT)
OUTPUT_LAYER = "output"
OUTPUT_WHY = "the output (vocabulary) layer: left in bf16 autocast, as torchtitan leaves it out of float8"
OUTSIDE_WHY = "not a linear layer of a transformer block"


@dataclasses.dataclass(frozen=True)
class Fp8Layers:
    """The model's linear layers by what they train in: those converted to FP8, and those left in
    high precision with why (layer name -> reason). Names are the whole model's, whichever part
    of it a pipeline stage holds."""

    recipe: str
    converted: tuple[str, ...]
    kept: dict[str, str]

    def describe(self, emulated: str | None) -> dict[str, Any]:
        """The result's ``engine.fp8``: the recipe, whether it ran emulated, and the layers by name
        pattern (each block's layers once, ``blocks.*.attn.q_proj``) with their counts."""
        kept: dict[tuple[str, str], int] = {}
        for name, why in self.kept.items():
            kept[(_pattern(name), why)] = kept.get((_pattern(name), why), 0) + 1
        return {
            "recipe": self.recipe,
            "emulated": emulated,
            "converted_layers": len(self.converted),
            "converted": _counted(self.converted),
            "high_precision_layers": len(self.kept),
            "high_precision": [{"layers": pattern, "count": count, "why": why}
                               for (pattern, why), count in kept.items()],
            "gemms": "forward, input-gradient and weight-gradient GEMMs of each converted layer",
        }


def _pattern(name: str) -> str:
    """'blocks.3.attn.q_proj' -> 'blocks.*.attn.q_proj'."""
    return re.sub(r"^blocks\.\d+\.", "blocks.*.", name)


def _counted(names: tuple[str, ...]) -> list[dict[str, Any]]:
    counts: dict[str, int] = {}
    for name in names:
        counts[_pattern(name)] = counts.get(_pattern(name), 0) + 1
    return [{"layers": pattern, "count": count} for pattern, count in counts.items()]


def plan_layers(model: nn.Module, recipe: str) -> Fp8Layers:
    """Which of ``model``'s linear layers train in FP8 (torchtitan's filter), the others with why."""
    converted: list[str] = []
    kept: dict[str, str] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        out_features, in_features = module.weight.shape
        if name == OUTPUT_LAYER:
            kept[name] = OUTPUT_WHY
        elif not name.startswith(BLOCK_PREFIX):
            kept[name] = OUTSIDE_WHY
        elif out_features % FP8_DIVISOR or in_features % FP8_DIVISOR:
            kept[name] = (f"its weight ({out_features} x {in_features}) has a dimension that is no multiple of "
                          f"{FP8_DIVISOR}, which FP8 GEMMs need")
        else:
            converted.append(name)
    return Fp8Layers(recipe, tuple(converted), kept)


def converts_on_meta(recipe: str) -> bool:
    """Whether ``recipe``'s conversion is made on the meta model (before parallel wrapping and the
    weights' values), else after the weights hold their values."""
    return recipe != "mxfp8"


def convert(model: nn.Module, layers: Fp8Layers, emulated: bool) -> None:
    """Convert ``layers.converted`` (those ``model`` holds: a pipeline stage holds some) in place.
    ``emulated``: the device has no FP8 units (the CPU); tensorwise and rowwise run torchao's own
    path to torch._scaled_mm all the same (the CPU has a kernel), mxfp8 takes torchao's emulated kernels."""
    wanted = set(layers.converted)

    def chosen(_module: nn.Module, name: str) -> bool:
        return name in wanted

    if layers.recipe == "mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
        from torchao.quantization import quantize_

        recipe = MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulated else MXFP8TrainingRecipe.MXFP8_RCEIL
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(recipe), filter_fn=chosen)
    else:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=chosen,
                                   config=Float8LinearConfig.from_recipe_name(layers.recipe))
    hook = _weight_dtype_input if layers.recipe == "mxfp8" else _autocast_input
    for name, module in model.named_modules():
        if name in wanted:
            module.register_forward_pre_hook(hook)


def _weight_dtype_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """An MXFP8 layer's input in its weight's dtype (the fp32 master weight's), before both are scaled
    to MXFP8: torchao's MXFP8 linear runs before autocast casts anything, and takes its two operands
    in one dtype; the input would otherwise come in fp32 from a LayerNorm and in bf16 from attention."""
    tensor, weight = args[0], module.weight
    if isinstance(tensor, torch.Tensor) and isinstance(weight, torch.Tensor) and tensor.dtype != weight.dtype:
        return (tensor.to(weight.dtype), *args[1:])
    return None


def _autocast_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """A converted layer's input in the autocast dtype of its device, before it is scaled to FP8.
    torchao's Float8Linear does this for CUDA's autocast only; on any other device the input would
    reach the FP8 cast in fp32 (a LayerNorm's output), not in bf16 as on a GPU."""
    tensor = args[0]
    if isinstance(tensor, torch.Tensor) and torch.is_autocast_enabled(tensor.device.type):
        return (tensor.to(torch.get_autocast_dtype(tensor.device.type)), *args[1:])
    return None
