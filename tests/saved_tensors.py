"""What autograd keeps for a backward, measured: the tensors its saved-tensor hooks
(torch.autograd.graph.saved_tensors_hooks) see at the forward, by storage, beside autocast's
copies of the parameters (autocast_copies.ParameterCasts). tests/test_planner.py and the rank
script tests/expert_parallel_saved.py hold the planner's activation bytes to it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable

import torch

from tests.autocast_copies import ParameterCasts


class SavedTensors(contextlib.ExitStack):
    """Within ``with``: every tensor autograd saves for the backward, held only by a weak
    reference (so recording changes nothing), with its storage's bytes, and autocast's copies of
    the parameters (``casts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: dict[int, list[tuple[weakref.ref, int]]] = {}  # storage -> (the saved tensor, its bytes)
        self.casts = ParameterCasts()

    def __enter__(self) -> SavedTensors:
        super().__enter__()
        self.enter_context(self.casts)
        self.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor))
        return self

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        self.saved.setdefault(storage.data_ptr(), []).append((weakref.ref(tensor), storage.nbytes()))
        return tensor

    def held_bytes(self, parameters: Iterable[torch.Tensor],
                   leave_out: Callable[[list[torch.Tensor]], bool] = lambda tensors: False) -> int:
        """The bytes of the saved storages still held now, each storage once (a node of a branch
        the forward dropped frees what it saved). Left out: the storages of ``parameters`` and of
        autocast's copies of them (the planner counts those apart), and a storage whose held
        tensors ``leave_out`` names."""
        weights = {parameter.untyped_storage().data_ptr() for parameter in parameters}
        weights |= {copy().untyped_storage().data_ptr() for copy, _ in self.casts.copies if copy() is not None}
        kept = 0
        for pointer, tensors in self.saved.items():
            alive = [(tensor(), size) for tensor, size in tensors if tensor() is not None]
            if alive and pointer not in weights and not leave_out([tensor for tensor, _ in alive]):
                kept += max(size for _, size in alive)
        return kept
