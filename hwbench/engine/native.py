"""The native engine: torch.distributed as it ships, on one DeviceMesh.

    tp > 1     DTensor tensor parallelism (hwbench.engine.parallelize)
    pp > 1     torch.distributed.pipelining stages over the block list, 1F1B or
               GPipe, microbatches = global batch / (micro batch x dp)
    dp > 1     DDP when it is the only dimension; FSDP2 with --fsdp; otherwise
               one all-reduce of the gradients over the dp group per step
    ep > 1     an MoE model's experts split over groups of ep data-parallel ranks,
               tokens exchanged by all-to-all (hwbench.engine.expert_parallel);
               the experts' gradients reduced over the ranks holding the same
               experts (edp), the rest over dp as above
    1 rank     plain PyTorch

Every layout takes the same optimizer step: gradients averaged over the global
batch, one global gradient norm (clipped to clip_grad), AdamW with Megatron's
schedule, fp16 loss scaling decided from that global norm
(hwbench.engine.loss_scale). So with the same seed and data every layout
follows the same loss curve, up to floating-point reduction order.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from hwbench.device import Backend
from hwbench.engine.base import StepOutcome, by_mesh, total_grad_norm
from hwbench.engine.distributed import DistContext, single_process
from hwbench.engine.expert_parallel import (
    AllToAllClock,
    apply_expert_fsdp,
    apply_expert_parallel,
    expert_parameter_names,
)
from hwbench.engine.float8 import convert as convert_to_fp8
from hwbench.engine.float8 import converts_on_meta, plan_layers
from hwbench.engine.loss_scale import LossScaler, overflow_flag
from hwbench.engine.optim import build_optimizer, step_learning_rate
from hwbench.engine.parallelize import apply_fsdp, apply_tensor_parallel, cut_pipeline_stage, stage_layers
from hwbench.precision import DEFAULT_FP8_RECIPE, FP8
from hwbench.spec import RunSpec
from hwbench.workload.config import GPTConfig
from hwbench.workload.data import Batch
from hwbench.workload.model import GPT, init_parameters

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from hwbench.checkpoint.native import TorchState


class NativeEngine:
    def __init__(self, config: GPTConfig, spec: RunSpec, backend: Backend, ctx: DistContext | None = None) -> None:
        self.spec, self.backend = spec, backend
        self.ctx = ctx or single_process(spec.parallel)
        dims = self.ctx.dims
        self.loss_parallel = dims.tp > 1 and dims.pp == 1
        self.data_parallel = _data_parallel_mode(dims.tp, dims.pp, dims.dp, spec.fsdp)
        # the time each training step spends in the all-to-alls of expert parallelism (None without)
        self.all_to_all_clock = AllToAllClock(backend.step_timer) if dims.ep > 1 else None
        self.model = self._build(config)
        self.model.train()
        self.optimizer = build_optimizer(self.model, spec.optimizer, backend.optimizer_options())
        self.scaler: LossScaler | None = None
        if spec.precision == "fp16":
            dynamic = spec.loss_scale is None
            initial = 2.0 ** spec.initial_scale_power if spec.loss_scale is None else spec.loss_scale
            self.scaler = LossScaler(initial, dynamic, backend.torch_device)
        # a tied output layer's copy on the last stage: summed with the first stage's embedding
        self.tied_copies = dims.pp > 1 and not config.untie_embeddings_and_output_weights
        self._tied_group = self._tied_embedding_group() if self.tied_copies else None
        self.schedule = self._pipeline_schedule() if dims.pp > 1 else None
        self.iteration = 0

    # construction -----------------------------------------------------------
    def _build(self, config: GPTConfig) -> nn.Module:
        """Meta model -> FP8 layers (tensorwise, rowwise) -> stage cut -> TP -> EP -> FSDP -> storage ->
        seed-determined weights -> FP8 layers (mxfp8) -> DDP (pure data parallelism only)."""
        spec, ctx, dims = self.spec, self.ctx, self.ctx.dims
        with torch.device("meta"):
            model = GPT(config, tensor_parallel=dims.tp, recompute=spec.recompute, cross_entropy=spec.cross_entropy,
                        fused_qkv=spec.fused_qkv)
        # FP8: the whole model's layers chosen before the stage cut, converted before any wrapping
        self.fp8 = plan_layers(model, spec.fp8_recipe or DEFAULT_FP8_RECIPE) if spec.precision == FP8 else None
        emulated = self.backend.fp8_emulation() is not None
        if self.fp8 and converts_on_meta(self.fp8.recipe):
            convert_to_fp8(model, self.fp8, emulated)
        if dims.pp > 1:
            cut_pipeline_stage(model, ctx.pp_rank, dims.pp)
        if dims.tp > 1:
            apply_tensor_parallel(model, ctx.submesh("tp"), loss_parallel=self.loss_parallel)
        if dims.ep > 1:
            apply_expert_parallel(model, ctx.submesh("ep"), self.all_to_all_clock)
        if spec.fsdp:
            # With pipelining each microbatch runs forward then backward later:
            # keep gathered parameters rather than re-gathering for every one.
            if dims.ep > 1:
                apply_expert_fsdp(model, ctx.submesh("edp"), reshard_after_forward=dims.pp == 1)
            apply_fsdp(model, ctx.submesh("dp"), reshard_after_forward=dims.pp == 1)
        model.to_empty(device=self.backend.torch_device)
        model.tie_output_to_embedding()
        init_parameters(model, spec.seed)
        if self.fp8 and not converts_on_meta(self.fp8.recipe):
            convert_to_fp8(model, self.fp8, emulated)
        self.gpt = model
        # found once: the experts' gradients are reduced apart at every step (_reduce_expert_gradients)
        expert_names = set(expert_parameter_names(model)) if dims.ep > 1 else set()
        self._expert_parameters = [p for name, p in model.named_parameters() if name in expert_names]
        if spec.compile:
            for block in model.blocks.values():
                block.compile()
        if self.data_parallel == "ddp":
            device_ids = None if self.backend.torch_device.type == "cpu" else [self.backend.torch_device]
            if dims.ep > 1:  # the experts' gradients are reduced over edp, not dp: _reduce_gradients
                DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                    model, expert_parameter_names(model))
            return DistributedDataParallel(model, device_ids=device_ids, process_group=ctx.group("dp"))
        return model

    def _tied_embedding_group(self) -> dist.ProcessGroup | None:
        """The group of the first and last stage with the same dp and tp
        coordinates: they hold the two copies of the tied word embedding."""
        ctx, dims = self.ctx, self.ctx.dims
        ranks = ctx.mesh.mesh  # (pp, dp, tp) tensor of global ranks
        mine = None
        for d in range(dims.dp):
            for t in range(dims.tp):
                pair = [int(ranks[0, d, t]), int(ranks[-1, d, t])]
                group = dist.new_group(pair)  # every rank creates every group, in the same order
                if ctx.rank in pair:
                    mine = group
        return mine

    def _pipeline_schedule(self) -> PipelineScheduleSingle:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        ctx, dims = self.ctx, self.ctx.dims
        stage = PipelineStage(self.model, ctx.pp_rank, dims.pp, self.backend.torch_device, group=ctx.group("pp"))
        kind = Schedule1F1B if self.spec.pp_schedule == "1f1b" else ScheduleGPipe
        # scale_grads: each microbatch's mean loss counts 1/microbatches, as in accumulation
        return kind(stage, n_microbatches=self.spec.gradient_accumulation_steps, loss_fn=self._pipeline_loss,
                    scale_grads=True)

    def _pipeline_loss(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = self.gpt.loss(output, labels)
        return loss * self.scaler.scale if self.scaler and self.model.training else loss

    # training -----------------------------------------------------------------
    def _loss_context(self) -> contextlib.AbstractContextManager:
        if self.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def _gradient_sync(self, last_micro_step: bool) -> contextlib.AbstractContextManager:
        """DDP and FSDP reduce gradients in the backward of the last micro-batch only."""
        if self.data_parallel == "ddp" and not last_micro_step:
            assert isinstance(self.model, DistributedDataParallel)  # _build wrapped it
            return self.model.no_sync()
        if self.spec.fsdp:  # FSDP is applied even at dp 1
            # fully_shard gives the model's class this method at run time
            self.gpt.set_requires_gradient_sync(last_micro_step)  # type: ignore[operator]
        return contextlib.nullcontext()

    def _forward_backward(self, next_batch: Callable[[], Batch]) -> torch.Tensor:
        """Gradients of this rank's share of the global batch; returns its mean loss."""
        accumulation = self.spec.gradient_accumulation_steps
        if self.schedule is not None:
            return self._pipeline_forward_backward(self.schedule, next_batch, accumulation)
        total_loss = torch.zeros((), device=self.backend.torch_device)
        for micro_step in range(accumulation):
            tokens, labels = next_batch()
            with self._gradient_sync(micro_step == accumulation - 1), self._loss_context():
                with self.backend.autocast(self.spec.precision):
                    loss = self.model(tokens, labels) / accumulation
                (loss * self.scaler.scale if self.scaler else loss).backward()
            total_loss += _local(loss.detach())
        return total_loss

    def _pipeline_forward_backward(self, schedule: PipelineScheduleSingle, next_batch: Callable[[], Batch],
                                   accumulation: int) -> torch.Tensor:
        batches = [next_batch() for _ in range(accumulation)]  # the schedule splits them again
        tokens = torch.cat([b[0] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        losses: list[torch.Tensor] = []
        first, last = self.ctx.pp_rank == 0, self.ctx.is_last_stage
        with self.backend.autocast(self.spec.precision):
            schedule.step(*((tokens,) if first else ()), target=labels if last else None,
                          losses=losses if last else None, return_outputs=False)
        if not last:
            return torch.full((), math.nan, device=self.backend.torch_device)
        loss = torch.stack([micro.detach().float() for micro in losses]).mean()
        return loss / self.scaler.scale if self.scaler else loss

    def _reduce_gradients(self) -> None:
        """What DDP or FSDP do not: the dp average when tensor or pipeline
        parallelism is on (one flat all-reduce), the experts' gradients beside DDP
        under expert parallelism, and the sum of the two tied embedding copies of
        the first and last pipeline stage (an untied output layer is a weight of its
        own: nothing to sum)."""
        dims = self.ctx.dims
        if dims.ep > 1:
            self._reduce_expert_gradients()
        if self.data_parallel == "all-reduce":
            self._all_reduce_mean([_local(p.grad) for p in self.model.parameters() if p.grad is not None], "dp")
        if self._tied_group is not None:
            dist.all_reduce(self._tied_gradient(), group=self._tied_group)

    def _reduce_expert_gradients(self) -> None:
        """The experts' gradients as the mean over the global batch: each already sums the tokens
        of its ep group (hwbench.engine.expert_parallel), so they are summed over the ranks holding
        the same experts (edp) and divided by dp. DDP leaves them out: one flat all-reduce here.
        FSDP2 has averaged them over edp: scaled by edp / dp."""
        grads = [_local(p.grad) for p in self._expert_parameters if p.grad is not None]
        if self.data_parallel == "fsdp2":
            torch._foreach_mul_(grads, 1.0 / self.ctx.dims.ep)
            return
        self._all_reduce_mean(grads, "edp")

    def _all_reduce_mean(self, grads: list[torch.Tensor], dim: str) -> None:
        """``grads`` summed over the mesh dimension ``dim`` in one flat all-reduce and divided by dp
        (the mean over the global batch), in place."""
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.ctx.all_reduce(flat, dim)
        flat /= self.ctx.dims.dp
        torch._foreach_copy_(grads, [part.view_as(g) for part, g in zip(flat.split([g.numel() for g in grads]),
                                                                          grads, strict=True)])

    def _tied_gradient(self) -> torch.Tensor:
        """This stage's copy of the tied embedding's gradient, laid out as its weight.
        Under TP, DTensor's embedding backward has no vocab-sharded rule: the first
        stage's embedding gradient comes back replicated over the whole vocabulary
        while the last stage's output gradient is sharded on it, so the two local
        tensors differ in size (2x at TP2) and the all-reduce would mismatch.
        Replicate -> Shard is a local slice, no communication."""
        layer = self.gpt.wte if self.ctx.pp_rank == 0 else self.gpt.output
        assert layer is not None  # the first stage holds the embedding, the last the output layer
        weight, grad = layer.weight, layer.weight.grad
        assert grad is not None  # called after the backward, which reaches both copies
        if isinstance(grad, DTensor) and isinstance(weight, DTensor) and grad.placements != weight.placements:
            weight.grad = grad = grad.redistribute(weight.device_mesh, weight.placements)
        return _local(grad)

    def _global_grad_norm(self) -> torch.Tensor:
        """The L2 norm of all gradients of the model, the same on every rank:
        DTensor shards reduced over their mesh, pipeline stages summed, and the
        last stage's copy of a tied embedding left out (counted once, as on one device;
        an untied output layer is counted, on the last stage, like any other weight)."""
        grads = [p.grad for name, p in self.gpt.named_parameters()
                 if p.grad is not None and not (self.tied_copies and name == "output.weight")]
        # one norm per mesh (expert parallelism's experts are sharded on another mesh than the rest,
        # and DTensor reduces one mesh at a time), their squares added
        norms = [total_grad_norm(together, self.backend.grad_norm_dtype) for together in by_mesh(grads)]
        norms = [norm.full_tensor() if hasattr(norm, "full_tensor") else norm for norm in norms]
        norm = norms[0] if len(norms) == 1 else torch.stack([n.float() for n in norms]).norm()
        if self.ctx.dims.pp > 1:
            squared = norm.float() ** 2
            self.ctx.all_reduce(squared, "pp")
            norm = squared.sqrt()
        return norm

    def train_step(self, next_batch: Callable[[], Batch]) -> StepOutcome:
        """One optimizer step over the global batch."""
        self.iteration += 1
        lr = step_learning_rate(self.spec.optimizer, self.iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = self._forward_backward(next_batch)
        self._reduce_gradients()
        scale = self.scaler.scale if self.scaler else None  # update() replaces it: this one stays this step's
        if self.scaler:  # unscale in one multi-tensor call per mesh, not a kernel per parameter
            for grads in by_mesh([p.grad for p in self.model.parameters() if p.grad is not None]):
                torch._foreach_mul_(grads, self.scaler.inverse_scale)
        grad_norm = self._global_grad_norm()
        if self.scaler:
            found_inf = overflow_flag(grad_norm)  # the same on every rank: the norm is global
            self.scaler.update(found_inf)
            skipped = self._step_unless_overflowed(grad_norm, found_inf)
        else:
            skipped = False
            self._clip_and_step(grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(loss=loss, grad_norm=grad_norm.detach(), lr=lr, loss_scale=scale, skipped=skipped)

    def _clip_and_step(self, grad_norm: torch.Tensor) -> None:
        if self.spec.optimizer.clip_grad > 0:  # 0: no clipping (Megatron-LM's and DeepSpeed's meaning)
            for parameters in by_mesh([p for p in self.model.parameters() if p.grad is not None]):
                torch.nn.utils.clip_grads_with_norm_(parameters, self.spec.optimizer.clip_grad, grad_norm)
        self.optimizer.step()

    def _step_unless_overflowed(self, grad_norm: torch.Tensor, found_inf: torch.Tensor) -> torch.Tensor | bool:
        """The optimizer step of an fp16 run, skipped when ``found_inf`` is 1; returns the
        skip flag (a device tensor where the device decided)."""
        if all(group["fused"] for group in self.optimizer.param_groups):
            # Fused AdamW reads found_inf on the device, as under torch's GradScaler: on an
            # overflow it leaves parameters and moments as they are and takes back its
            # step-count increment. Clipping by an inf/nan norm spoils only gradients that
            # zero_grad drops. So the host never waits for the device here.
            self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]  # fused AdamW reads it, undeclared
            self._clip_and_step(grad_norm)
            return found_inf
        # foreach/for-loop AdamW (a device kind without fused AdamW, device/kinds.py) has no
        # found_inf: the host must read the flag, one sync per step, as Megatron's and torch's
        # scalers have with such optimizers.
        skipped = bool(found_inf)
        if not skipped:
            self._clip_and_step(grad_norm)
        return skipped

    # validation ---------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, batches: Iterable[Batch]) -> tuple[float, int]:
        """Token-weighted mean loss over ``batches`` on every dp rank together (as
        Megatron's validation: sum of loss x tokens / tokens), the same on every rank."""
        self.model.eval()
        device = self.backend.torch_device
        totals = torch.zeros(2, device=device, dtype=torch.float64)  # loss x tokens, tokens
        try:
            if self.schedule is not None:
                self._pipeline_evaluate(self.schedule, list(batches), totals)
            else:
                for inputs, labels in batches:
                    with self._loss_context(), self.backend.autocast(self.spec.precision):
                        loss = _local(self.model(inputs, labels))
                    totals[0] += loss.double() * labels.numel()
                    totals[1] += labels.numel()
        finally:
            self.model.train()
        self.ctx.all_reduce(totals, "dp")
        if self.ctx.dims.pp > 1:  # only the last stage has the loss: share it along the pipeline
            if not self.ctx.is_last_stage:
                totals.zero_()
            self.ctx.all_reduce(totals, "pp")
        return (totals[0] / totals[1].clamp(min=1)).item(), int(totals[1].item())

    def _pipeline_evaluate(self, schedule: PipelineScheduleSingle, batches: list[Batch], totals: torch.Tensor) -> None:
        group = self.spec.gradient_accumulation_steps  # the schedule's microbatch count
        first, last = self.ctx.pp_rank == 0, self.ctx.is_last_stage
        for start in range(0, len(batches), group):
            chunk = batches[start:start + group]
            tokens, labels = torch.cat([b[0] for b in chunk]), torch.cat([b[1] for b in chunk])
            losses: list[torch.Tensor] = []
            with self.backend.autocast(self.spec.precision):
                schedule.eval(*((tokens,) if first else ()), target=labels if last else None,
                              losses=losses if last else None)
            if last:
                per_micro = labels.numel() // len(losses)
                totals[0] += sum(micro.double() for micro in losses) * per_micro
                totals[1] += labels.numel()

    def describe(self) -> dict[str, Any]:
        dims = self.ctx.dims
        stage_blocks = [list(stage_layers(self.gpt.config.num_layers, dims.pp, s)) for s in range(dims.pp)]
        return {
            "name": "native",
            "data_parallel": self.data_parallel,
            "tensor_parallel": "dtensor" if dims.tp > 1 else None,
            "expert_parallel": "all-to-all" if dims.ep > 1 else None,
            "vocab_parallel": dims.tp > 1,
            "loss_parallel": self.loss_parallel,
            "pipeline_schedule": self.spec.pp_schedule if dims.pp > 1 else None,
            "pipeline_microbatches": self.spec.gradient_accumulation_steps if dims.pp > 1 else None,
            "pipeline_stage_layers": stage_blocks if dims.pp > 1 else None,
            "loss_scaling": None if not self.scaler else ("dynamic" if self.scaler.dynamic else "fixed"),
            "compile": self.spec.compile,
            "recompute": self.spec.recompute,
            **({"fp8": self.fp8.describe(self.backend.fp8_emulation())} if self.fp8 else {}),
        }

    # checkpoints ----------------------------------------------------------------
    def checkpoint_state(self) -> TorchState:
        """Model, optimizer and loss scaler (DCP's module imported here: only when a checkpoint asks)."""
        from hwbench.checkpoint.native import TorchState

        return TorchState(self.model, self.optimizer, self.scaler)

    def resume_at(self, iteration: int) -> None:
        self.iteration = iteration

    def close(self) -> None:
        """Nothing to release: the worker owns the process group."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local part of a DTensor (a replicated loss, a sharded gradient); a plain tensor as is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _data_parallel_mode(tp: int, pp: int, dp: int, fsdp: bool) -> str | None:
    """How gradients are averaged over data parallelism: None (dp 1), "fsdp2", "ddp"
    (pure data parallelism), or "all-reduce" (one flat all-reduce beside TP or PP)."""
    if dp == 1:
        return None
    if fsdp:
        return "fsdp2"
    return "ddp" if tp == 1 and pp == 1 else "all-reduce"
