"""Engines: native (torch.distributed) and deepspeed (ZeRO; its pipeline engine with --tp/--pp)."""

from __future__ import annotations

from hwbench.device import Backend
from hwbench.engine.base import Engine, StepOutcome
from hwbench.engine.distributed import DistContext
from hwbench.spec import RunSpec
from hwbench.workload.config import GPTConfig


def build_engine(config: GPTConfig, spec: RunSpec, backend: Backend, ctx: DistContext) -> Engine:
    """The engine --engine names, with its model built for this rank."""
    backend.seed(spec.seed)
    if spec.engine == "deepspeed" and (spec.parallel.tp > 1 or spec.parallel.pp > 1):
        from hwbench.engine.deepspeed_pipeline import DeepSpeedPipelineEngine

        return DeepSpeedPipelineEngine(config, spec, backend, ctx)  # builds its own layers, per stage
    if spec.engine == "deepspeed":
        from hwbench.engine.deepspeed import DeepSpeedEngine
        from hwbench.workload.model import build_model

        model = build_model(config, device=backend.torch_device, seed=spec.seed, recompute=spec.recompute,
                            fused_qkv=spec.fused_qkv)  # chunked cross-entropy: native only (spec.py)
        return DeepSpeedEngine(model, spec, backend, ctx)
    from hwbench.engine.native import NativeEngine

    return NativeEngine(config, spec, backend, ctx)


__all__ = ["Engine", "StepOutcome", "build_engine"]
