"""The DeepSpeed engines' state in a checkpoint, through DeepSpeed's own
``save_checkpoint``/``load_checkpoint``: its files as DeepSpeed names them
(``mp_rank_00_model_states.pt``, one ``zero_pp_rank_N_mp_rank_00_optim_states.pt`` per
data-parallel rank under ZeRO, ``layer_NN-model_states.pt`` per pipeline layer), holding
the module, the optimizer with the fp16 loss scaler, and the learning-rate scheduler.

DeepSpeed writes into ``SAVE_DIR/TAG/``; hwbench gives the checkpoint folder itself as
SAVE_DIR and "." as the tag, so the files land in the iteration folder (Megatron-LM's
name, hwbench.checkpoint) and nothing (no ``latest`` file, no recovery script) beside it.
The bytes each rank wrote or read are those of the files DeepSpeed's checkpoint engine
saved or loaded on that rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hwbench.checkpoint import sync_to_disk
from hwbench.checkpoint.state import StateWrite

IN_FOLDER = "."  # DeepSpeed's tag: the folder DeepSpeed is given holds the files itself
RECOVERY_SCRIPTS = "zero_to_*.py"  # DeepSpeed copies them next to a ZeRO checkpoint (rank 0)


@contextlib.contextmanager
def _recording(checkpoint_engine: Any, method: str) -> Iterator[list[Path]]:
    """The paths ``checkpoint_engine.save(state_dict, path)`` or ``.load(path, ...)`` is
    called with, while inside."""
    paths: list[Path] = []
    original = getattr(checkpoint_engine, method)
    position = 1 if method == "save" else 0

    def recorded(*args: Any, **kwargs: Any) -> Any:
        paths.append(Path(kwargs["path"] if "path" in kwargs else args[position]))
        return original(*args, **kwargs)

    setattr(checkpoint_engine, method, recorded)  # on the instance: the class's method is untouched
    try:
        yield paths
    finally:
        delattr(checkpoint_engine, method)


@dataclasses.dataclass(frozen=True)
class DeepSpeedState:
    """A DeepSpeed engine's state in a checkpoint (hwbench.checkpoint.state.EngineState): the
    engine itself (data parallel or pipeline), which saves and loads its module, optimizer,
    loss scaler and learning-rate scheduler."""

    engine: Any

    def save(self, folder: Path, rank: int, asynchronous: bool, process_group: Any = None) -> StateWrite:
        """Every rank calls DeepSpeed's save_checkpoint into ``folder`` (never asynchronous:
        --async-save is refused for DeepSpeed); this rank's files, flushed to the disk before the
        write counts as finished (DeepSpeed's torch.save leaves them in the page cache, whose GB/s
        would be timed instead of the storage's)."""
        with _recording(self.engine.checkpoint_engine, "save") as paths:
            self.engine.save_checkpoint(str(folder), tag=IN_FOLDER, save_latest=False)
        written = sorted(set(paths)) + (sorted(folder.glob(RECOVERY_SCRIPTS)) if rank == 0 else [])
        sync_to_disk(*(path for path in written if path.is_file()), folder)
        return StateWrite(lambda _folder: written)  # recorded as written: _written finds each where it is now

    def load(self, folder: Path) -> int:
        """DeepSpeed's load_checkpoint of ``folder`` (module, optimizer, loss scaler, scheduler);
        the bytes this rank read."""
        with _recording(self.engine.checkpoint_engine, "load") as paths:
            load_path, _client_state = self.engine.load_checkpoint(
                str(folder), tag=IN_FOLDER, load_optimizer_states=True, load_lr_scheduler_states=True)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint in {folder}")
        return sum(path.stat().st_size for path in paths if path.is_file())
