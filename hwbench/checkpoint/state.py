"""An engine's state in a checkpoint: what an engine hands over (``Engine.checkpoint_state()``,
hwbench.engine.base) and one rank's write of it. The native engine hands its torch objects,
saved through torch.distributed.checkpoint (hwbench.checkpoint.native); a DeepSpeed engine
hands itself, saved through its own save_checkpoint (hwbench.checkpoint.deepspeed). The
engines call none of it: the run's saves (hwbench.harness.checkpointing) do.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol


@dataclasses.dataclass
class StateWrite:
    """One rank's write of an engine's state into a checkpoint folder: finished when it
    returns, or (an async save) running in the background until ``done()``."""

    files: Callable[[Path], list[Path]]  # what this rank wrote, once finished, as found in a folder
    future: Future | None = None  # the background write of an async save
    finished_at: float | None = None  # time.perf_counter() when it finished

    def __post_init__(self) -> None:
        if self.future is None:
            self.finished_at = time.perf_counter()
        else:
            self.future.add_done_callback(self._finished)

    def _finished(self, _future: Future) -> None:
        self.finished_at = time.perf_counter()

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def wait(self, folder: Path, *renamed: Path) -> list[Path]:
        """The files this rank wrote, once the write has finished (its error if it failed), looked for in
        the ``folder`` it wrote into, then in the one rank 0 may have ``renamed`` it to since (rank 0
        commits a save as soon as its own write is done, while another rank may still be looking)."""
        if self.future is not None:
            self.future.result()
        return next((found for where in (folder, *renamed) if (found := self.files(where))), [])


class EngineState(Protocol):
    """What an engine hands a checkpoint: native.TorchState or deepspeed.DeepSpeedState."""

    def save(self, folder: Path, rank: int, asynchronous: bool, process_group: Any = None) -> StateWrite:
        """Write the state into ``folder`` (every rank calls it; each writes its part)."""

    def load(self, folder: Path) -> int:
        """Load the state saved in ``folder`` into this rank's objects; the bytes this rank read."""
