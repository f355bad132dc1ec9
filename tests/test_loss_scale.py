"""fp16 loss scaling on the device: the same decisions as the host scaler hwbench had
(Megatron's and DeepSpeed's: halve after HYSTERESIS overflows, double after
LOSS_SCALE_WINDOW clean steps), the same skipped steps and the same parameters, and no
host read inside a training step when AdamW is fused."""

from __future__ import annotations

import contextlib
import dataclasses
import random

import pytest
import torch

from hwbench.catalog import load_catalog
from hwbench.device.cpu import CpuBackend
from hwbench.engine import loss_scale
from hwbench.engine.loss_scale import HYSTERESIS, LOSS_SCALE_WINDOW, LossScaler, overflow_flag
from hwbench.engine.native import NativeEngine
from hwbench.spec import build_run_spec
from hwbench.workload.data import SyntheticTokens


class HostLossScaler:
    """The host scaler hwbench used before the state moved to the device, kept as the
    reference its decisions must equal."""

    def __init__(self, initial_scale: float, dynamic: bool, window: int = LOSS_SCALE_WINDOW) -> None:
        self.scale, self.dynamic, self.window = float(initial_scale), dynamic, window
        self.clean_steps, self.hysteresis_left = 0, HYSTERESIS

    def update(self, overflowed: bool) -> None:
        if not self.dynamic:
            return
        if overflowed:
            self.clean_steps = 0
            self.hysteresis_left -= 1
            if self.hysteresis_left <= 0:
                self.scale = max(self.scale / 2.0, loss_scale.MIN_LOSS_SCALE)
        else:
            self.clean_steps += 1
            if self.clean_steps == self.window:
                self.clean_steps = 0
                self.hysteresis_left = HYSTERESIS
                self.scale *= 2.0


def flag(overflowed: bool) -> torch.Tensor:
    return overflow_flag(torch.tensor(float("inf") if overflowed else 1.0))


def scales_after(scaler, overflows) -> list[float]:
    """The scale after each update, read from a host or a device scaler."""
    seen = []
    for overflowed in overflows:
        scaler.update(flag(overflowed) if isinstance(scaler, LossScaler) else overflowed)
        seen.append(float(scaler.scale))
    return seen


def test_the_overflow_flag_is_one_for_inf_and_nan_only():
    norms = [1.0, 0.0, 65504.0, float("inf"), float("-inf"), float("nan")]
    assert [float(overflow_flag(torch.tensor(n))) for n in norms] == [0, 0, 0, 1, 1, 1]
    assert overflow_flag(torch.tensor(1.0)).dtype == torch.float32 and overflow_flag(torch.tensor(1.0)).dim() == 0


def test_the_scale_halves_after_hysteresis_overflows_and_doubles_after_the_real_window():
    scaler = LossScaler(2.0 ** 12, dynamic=True)
    assert scales_after(scaler, [True] * (HYSTERESIS - 1)) == [2.0 ** 12] * (HYSTERESIS - 1)  # tolerated
    assert scales_after(scaler, [True]) == [2.0 ** 11]
    assert scales_after(scaler, [True]) == [2.0 ** 10]  # hysteresis spent: every overflow halves now
    grown = scales_after(scaler, [False] * LOSS_SCALE_WINDOW)
    assert grown[-2:] == [2.0 ** 10, 2.0 ** 11]  # doubled on the 1000th clean step, not before
    assert scales_after(scaler, [True]) == [2.0 ** 11]  # and the hysteresis is back


def test_the_scale_never_goes_below_the_minimum():
    assert scales_after(LossScaler(4.0, dynamic=True), [True] * 6)[-1] == loss_scale.MIN_LOSS_SCALE


def test_a_fixed_scale_never_changes():
    assert scales_after(LossScaler(65536.0, dynamic=False), [True, True, True, False]) == [65536.0] * 4


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_device_and_host_scalers_agree_on_any_overflow_sequence(monkeypatch, seed):
    monkeypatch.setattr(loss_scale, "LOSS_SCALE_WINDOW", 4)  # many windows in a short sequence
    rng = random.Random(seed)
    overflows = [rng.random() < 0.3 for _ in range(300)]
    expected = scales_after(HostLossScaler(2.0 ** 12, True, window=4), overflows)
    assert scales_after(LossScaler(2.0 ** 12, True), overflows) == expected
    assert len(set(expected)) > 3  # the sequence did move the scale both ways


# Training ----------------------------------------------------------------------------------------

class HostDecidedEngine(NativeEngine):
    """NativeEngine's fp16 step as it was before the decision moved to the device: the host
    reads whether the norm is finite, updates a host scaler and calls the optimizer only
    on clean steps."""

    def __init__(self, *args, window: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.host_scaler = HostLossScaler(float(self.scaler.scale), self.scaler.dynamic, window)

    def train_step(self, next_batch):
        self.scaler.scale = torch.tensor(self.host_scaler.scale)  # what forward/backward multiply by
        self.iteration += 1
        lr = self._set_lr()
        loss = self._forward_backward(next_batch)
        self._reduce_gradients()
        scale = self.host_scaler.scale
        torch._foreach_mul_([p.grad for p in self.model.parameters() if p.grad is not None], 1.0 / scale)
        grad_norm = self._global_grad_norm()
        skipped = not bool(torch.isfinite(grad_norm))
        self.host_scaler.update(skipped)
        if not skipped:
            self._clip_and_step(grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return dataclasses.replace(self._outcome_type(loss, grad_norm, lr), loss_scale=scale, skipped=skipped)

    def _set_lr(self):
        from hwbench.engine.optim import step_learning_rate

        lr = step_learning_rate(self.spec.optimizer, self.iteration)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    @staticmethod
    def _outcome_type(loss, grad_norm, lr):
        from hwbench.engine.base import StepOutcome

        return StepOutcome(loss=loss, grad_norm=grad_norm, lr=lr, loss_scale=None, skipped=False)


SEQ, BATCH = 16, 1  # small: fp16 on a CPU without fp16 units is emulated, and slow
# tiny's layers with 512 tokens instead of GPT-2's 50257: the scaler's decisions and the optimizer's
# skips do not depend on the vocabulary, whose 6.4M embedding rows were most of each emulated step
VOCAB = 512


def fp16_spec():
    return build_run_spec({"model": "tiny", "device": "cpu", "precision": "fp16", "seq_length": SEQ,
                           "micro_batch_size": BATCH, "global_batch_size": BATCH}, load_catalog())


def batches():
    return SyntheticTokens(VOCAB, SEQ, BATCH, BATCH, seed=5)


def build(engine_type, spec, optimizer_options=None, **kwargs):
    backend = CpuBackend()
    backend.prepare_process()
    if optimizer_options is not None:
        backend.optimizer_options = lambda: optimizer_options
    backend.seed(spec.seed)
    config = dataclasses.replace(load_catalog().workloads["tiny"].model, vocab_size=VOCAB)
    return engine_type(config, spec, backend, **kwargs)


def overflow_on(engine, steps):
    """Make the gradient of one weight infinite on the given (1-based) steps, as an fp16
    overflow in the backward would."""
    weight = engine.model.blocks["0"].mlp.fc1.weight
    weight.register_hook(lambda grad: grad * float("inf") if engine.iteration in steps else grad)


def train(engine, steps):
    data = batches()
    outcomes = [engine.train_step(data.train_batch) for _ in range(steps)]
    return [float(o.loss_scale) for o in outcomes], [bool(o.skipped) for o in outcomes]


# Overflows that exercise the hysteresis (one tolerated, then halving, then halving again
# with the hysteresis spent), growth after a clean window, and an overflow right after it.
OVERFLOW_STEPS = {2, 4, 5, 10, 11}
WINDOW = 3


@pytest.mark.parametrize("optimizer", [{"fused": True}, {"foreach": True}], ids=["fused", "foreach"])
def test_fp16_training_skips_the_steps_and_ends_at_the_parameters_of_the_host_scaler(monkeypatch, optimizer):
    monkeypatch.setattr(loss_scale, "LOSS_SCALE_WINDOW", WINDOW)
    spec = fp16_spec()
    device = build(NativeEngine, spec, optimizer)
    host = build(HostDecidedEngine, spec, optimizer, window=WINDOW)
    for engine in (device, host):
        overflow_on(engine, OVERFLOW_STEPS)
    steps = 13
    device_scales, device_skipped = train(device, steps)
    host_scales, host_skipped = train(host, steps)
    assert device_skipped == host_skipped == [s in OVERFLOW_STEPS for s in range(1, steps + 1)]
    assert device_scales == host_scales
    assert host_scales[:7] == [4096.0, 4096.0, 4096.0, 4096.0, 2048.0, 1024.0, 1024.0]  # as designed above
    assert max(host_scales[7:]) == 2048.0  # grown after WINDOW clean steps
    for (name, a), b in zip(device.model.named_parameters(), host.model.parameters()):
        assert torch.equal(a, b), f"{name} differs from the host-decided run"
    steps_taken = [s["step"] for s in device.optimizer.state.values()]
    assert all(float(step) == steps - len(OVERFLOW_STEPS) for step in steps_taken)  # skipped steps not counted


@contextlib.contextmanager
def host_reads_forbidden():
    """Any read of a tensor's value on the host (what would wait for a GPU) raises."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("a training step read a tensor's value on the host")

    names = ("__bool__", "__float__", "__int__", "item", "tolist")
    saved = {name: getattr(torch.Tensor, name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def test_a_fused_fp16_step_never_reads_a_value_on_the_host():
    engine = build(NativeEngine, fp16_spec(), {"fused": True})
    overflow_on(engine, {2})
    data = batches()
    with host_reads_forbidden():
        outcomes = [engine.train_step(data.train_batch) for _ in range(3)]
    assert all(isinstance(o.skipped, torch.Tensor) and isinstance(o.loss_scale, torch.Tensor) for o in outcomes)
    assert [bool(o.skipped) for o in outcomes] == [False, True, False]  # read after the loop, as the worker does


def test_the_host_read_check_can_fail():
    engine = build(NativeEngine, fp16_spec(), {"foreach": True})  # this path must read the flag
    data = batches()
    with host_reads_forbidden(), pytest.raises(AssertionError, match="read a tensor's value"):
        engine.train_step(data.train_batch)
