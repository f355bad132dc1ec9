"""The native engine's state in a checkpoint, through torch.distributed.checkpoint (DCP).

The state is torch's distributed state dict of the model and the AdamW optimizer
(``get_state_dict``: keyed by parameter name, the optimizer's hyperparameters too,
DTensors for tensor-parallel and FSDP2 shards, the DDP prefix removed) and the fp16 loss
scaler's tensors. Each rank writes its own shards (``__<rank>_<n>.distcp``) and rank 0 the metadata, so a save scales
with the ranks; a load reads whatever parts of the saved shards this layout's shards
cover, which is how a checkpoint of one layout loads into another (TP2 into one
process, FSDP2 into DDP, PP2 into one process).

One reshaping DCP cannot do: the vocabulary is padded to a multiple of 128 x TP, as
Megatron-LM pads it, so the word embedding (and the untied output layer of a pipeline's
last stage) has more rows under TP2 than under TP1. Those tensors are read into a
buffer of their saved shape and their rows copied (a padded row that only one side has
keeps its initial value); every other shape difference is DCP's error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from hwbench.checkpoint.state import StateWrite

# One process saves and loads without a process group, as meant: DCP warns about it every time.
ONE_PROCESS_WARNING = "torch.distributed is (disabled, )?unavailable or uninitialized"
warnings.filterwarnings("ignore", message=ONE_PROCESS_WARNING, category=UserWarning)  # async saves' threads

# The optimizer state keyed by parameter name throughout, its hyperparameters included
# ("param_groups.<name>.lr"): what each rank holds is then named the same in every layout.
BY_NAME = StateDictOptions(flatten_optimizer_state_dict=True)
# How this process runs AdamW (fused on a GPU, foreach on the CPU), not a property of the training: kept on load.
IMPLEMENTATION = ("fused", "foreach", "capturable", "differentiable")

# State-dict keys whose first dimension is the padded vocabulary (model and optimizer entries).
VOCAB_ROWS = re.compile(r"(^|\.)(wte|output)\.weight(\.|$)")


@dataclasses.dataclass(frozen=True)
class TorchState:
    """The native engine's state in a checkpoint (hwbench.checkpoint.state.EngineState): its
    model and AdamW, the live ones (a load writes into them), and the fp16 loss scaler
    (``state_dict``/``load_state_dict``; None without fp16)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_scaler: Any

    def save(self, folder: Path, rank: int, asynchronous: bool, process_group: Any = None) -> StateWrite:
        """Write the state into ``folder``, each rank its own shards. Asynchronous: the state is
        copied to host memory now and written by a background thread (on ``process_group``,
        a group of its own, so its collectives never meet the training's)."""
        state = _state_dict(self)
        writer = dcp.FileSystemWriter(folder)

        def files(where: Path) -> list[Path]:
            own = sorted(where.glob(f"__{rank}_*"))
            return own + ([where / ".metadata"] if rank == 0 and (where / ".metadata").exists() else [])

        if not asynchronous:
            with _quiet():
                dcp.save(state, storage_writer=writer, no_dist=not dist.is_initialized())
            return StateWrite(files)
        response = dcp.async_save(
            state, storage_writer=writer, process_group=process_group, no_dist=not dist.is_initialized()
        )
        # newer torch may answer an AsyncSaveResponse, whose upload_completion is the write
        future = response if isinstance(response, Future) else response.upload_completion
        return StateWrite(files, future)

    def load(self, folder: Path) -> int:
        """Load the state saved in ``folder`` into this rank's model, optimizer and loss scaler,
        resharded to this layout; returns the bytes this rank read."""
        state = _state_dict(self)
        reader = _CountingReader(folder)
        saved = reader.read_metadata().state_dict_metadata
        if self.loss_scaler is not None and not any(key.startswith("loss_scaler.") for key in saved):
            del state["loss_scaler"]  # saved without fp16: the scaler starts afresh
        bridged = _vocab_buffers(state, saved)
        try:
            with _quiet():
                dcp.load(state, storage_reader=reader, no_dist=not dist.is_initialized())
        except CheckpointException as error:  # a BaseException: the worker records Exceptions as the run's failure
            raise RuntimeError(f"torch.distributed.checkpoint could not load {folder}: "
                               f"{_first_failure(error)}") from error
        for parent, key, target in bridged:
            _copy_rows(target, parent[key])
            parent[key] = target
        implementation = [{key: group[key] for key in IMPLEMENTATION if key in group}
                          for group in self.optimizer.param_groups]
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"], options=BY_NAME)
        for group, kept in zip(self.optimizer.param_groups, implementation):  # the groups the load made
            group.update(kept)
        if "loss_scaler" in state:
            self.loss_scaler.load_state_dict(state["loss_scaler"])
        return reader.bytes_read


def _state_dict(state: TorchState) -> dict[str, Any]:
    """What the native engine saves: model and optimizer by parameter name, and the fp16
    loss scaler's state when there is one. The tensors are the live ones (a load writes
    into them)."""
    model_state, optimizer_state = get_state_dict(state.model, state.optimizer, options=BY_NAME)
    saved = {"model": model_state, "optimizer": optimizer_state}
    if state.loss_scaler is not None:
        saved["loss_scaler"] = state.loss_scaler.state_dict()
    return saved


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=ONE_PROCESS_WARNING, category=UserWarning)
        yield


class _CountingReader(dcp.FileSystemReader):
    """A FileSystemReader that counts the bytes it reads (each stored item once)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.bytes_read = 0

    def read_data(self, plan, planner):
        items = {item.storage_index for item in plan.items}
        self.bytes_read += sum(self.storage_data[index].length for index in items)
        return super().read_data(plan, planner)


def _first_failure(error: CheckpointException) -> str:
    """The first rank's failure in a CheckpointException (rank: its exception's first line)."""
    for rank, failure in sorted(error.failures.items()):
        exception = failure[0] if isinstance(failure, tuple) else failure
        text = str(exception).strip().splitlines()
        return f"rank {rank}: {type(exception).__name__}: {text[0] if text else ''}"
    return str(error)


def _tensors(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any], str]]:
    """(DCP's dotted key, parent mapping, key) of every tensor in nested mappings."""
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from _tensors(value, dotted)
        elif isinstance(value, torch.Tensor):
            yield dotted, tree, key


def _vocab_buffers(state: dict[str, Any], saved: dict[str, Any]) -> list[tuple[dict[str, Any], str, torch.Tensor]]:
    """Swap each vocabulary-row tensor whose saved row count differs for a buffer of the
    saved shape (the whole tensor on every rank); returns (mapping, key, the tensor swapped out)."""
    pairs = []
    for dotted, parent, key in list(_tensors(state)):
        target, stored = parent[key], saved.get(dotted)
        size = getattr(stored, "size", None)
        if size is None or not VOCAB_ROWS.search(dotted) or tuple(size) == tuple(target.shape):
            continue
        if tuple(size)[1:] != tuple(target.shape)[1:]:
            continue  # not a padding difference: DCP names it
        local = target.to_local() if isinstance(target, DTensor) else target
        parent[key] = torch.empty(tuple(size), dtype=target.dtype, device=local.device)
        pairs.append((parent, key, target))
    return pairs


def _copy_rows(target: torch.Tensor, buffer: torch.Tensor) -> None:
    """The rows ``target`` and ``buffer`` share, copied into ``target`` (a DTensor through its
    whole tensor, redistributed as it was)."""
    rows = min(buffer.shape[0], target.shape[0])
    with torch.no_grad():
        if isinstance(target, DTensor):
            whole = target.full_tensor()
            whole[:rows].copy_(buffer[:rows])
            target.to_local().copy_(distribute_tensor(whole, target.device_mesh, target.placements).to_local())
        else:
            target[:rows].copy_(buffer[:rows])


def checkpoint_group(distributed: bool) -> Any:
    """A gloo group of every rank for the background writes of async saves (DCP's advice:
    a group apart from the training's); None with one process. Every rank calls it."""
    return dist.new_group(backend="gloo") if distributed else None
