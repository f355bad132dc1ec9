"""What autocast really keeps: the 16-bit copies of fp32 parameters it made, and which of
them are still alive at a point of the step (tests/test_planner.py checks the planner's
`cast_weights_bytes` against it).

Run under torchrun it measures one rank of an FSDP2 model (hwbench's own apply_fsdp):

    python -m torch.distributed.run --nproc-per-node 2 --standalone tests/autocast_copies.py OUT_DIR [--recompute]

and each rank writes OUT_DIR/rank<N>.json with the bytes alive at the end of the forward.
"""

from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HALF_DTYPES = (torch.bfloat16, torch.float16)


class ParameterCasts(TorchDispatchMode):
    """Records every 16-bit copy made of an fp32 parameter (a leaf that requires grad: what
    autocast casts and caches) and answers how many bytes of them are alive now. The copies
    are held only by weak references, so holding them here changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[weakref.ref, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        source = args[0] if args else None
        if (func is torch.ops.aten._to_copy.default and isinstance(source, torch.Tensor)
                and source.dtype == torch.float32 and source.is_leaf and source.requires_grad
                and out.dtype in HALF_DTYPES):
            self.copies.append((weakref.ref(out), out.numel() * out.element_size()))
        return out

    def alive_bytes(self) -> int:
        return sum(size for copy, size in self.copies if copy() is not None)


def forward_backward(model, inputs, loss_of) -> dict[str, int]:
    """One forward under bf16 autocast, then its backward, as the native engine runs them
    (the loss inside autocast, the backward after it): the bytes of parameter copies alive at
    the end of the forward, after autocast has exited, and after the backward."""
    casts = ParameterCasts()
    with casts:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(model(inputs))
            end_of_forward = casts.alive_bytes()
        after_autocast = casts.alive_bytes()
        loss.backward()
        after_backward = casts.alive_bytes()
    return {"end_of_forward": end_of_forward, "after_autocast": after_autocast, "after_backward": after_backward}


def main(argv: list[str]) -> int:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hwbench.engine.parallelize import apply_fsdp
    from hwbench.workload.model import build_model, lm_loss
    from tests.test_planner import CONFIG

    out, recompute = Path(argv[0]), "--recompute" in argv
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = build_model(CONFIG, device=torch.device("cpu"), seed=1, recompute=recompute)
    apply_fsdp(model, mesh, reshard_after_forward=True)
    generator = torch.Generator().manual_seed(dist.get_rank())
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 16), generator=generator)
    figures = forward_backward(model, tokens, lambda logits: lm_loss(logits, torch.roll(tokens, -1, 1)))
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(figures))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main(sys.argv[1:]))
