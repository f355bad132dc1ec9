"""Checkpoint folders as Megatron-LM names them, without torch: their names, and what `--load`
finds and checks before anything starts (hwbench.harness.checkpointing writes them).

    SAVE_DIR/latest_checkpointed_iteration.txt     the newest whole checkpoint's iteration ("6")
    SAVE_DIR/iter_0000006/                          one checkpoint (Megatron-LM's folder name)
        hwbench_checkpoint.json                     the manifest: iteration, model, layout, data
                                                    position, every file with its size
        __0_0.distcp ... .metadata                  the native engine's state (torch.distributed.checkpoint)
        mp_rank_00_model_states.pt ...              or DeepSpeed's own files (save_checkpoint)
        rng_rank_00000.pt ...                       each rank's random-number generator states

A save is written under a hidden temporary name (``.iter_0000006.partial``), the manifest
last, then renamed to ``iter_0000006`` and only then named in the latest file (written
atomically): a save that fails half way, on a full disk say, is never named latest and the
previous checkpoint stays as it was.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from hwbench.errors import UsageError

LATEST_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's name
MANIFEST_FILE = "hwbench_checkpoint.json"
MANIFEST_FORMAT = "hwbench-checkpoint"
MANIFEST_VERSION = 1
PARTIAL_SUFFIX = ".partial"
RNG_FILE = "rng_rank_{rank:05d}.pt"


def iteration_folder_name(iteration: int) -> str:
    """Megatron-LM's folder of the checkpoint after ``iteration`` steps: iter_0000006."""
    return f"iter_{iteration:07d}"


def partial_folder(save_dir: Path, iteration: int) -> Path:
    """Where a save is written before it is whole: a hidden name that nothing loads."""
    return save_dir / f".{iteration_folder_name(iteration)}{PARTIAL_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class SavedCheckpoint:
    """One whole checkpoint: its folder and its manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def iteration(self) -> int:
        return int(self.manifest["iteration"])

    @property
    def engine(self) -> str:
        return str(self.manifest["engine"])

    def data_position(self) -> dict[str, int]:
        """consumed_train_samples and consumed_valid_samples (Megatron-LM's names)."""
        return {key: int(self.manifest["data"][key]) for key in ("consumed_train_samples", "consumed_valid_samples")}


def find_checkpoint(path: str | os.PathLike, option: str = "--load") -> SavedCheckpoint:
    """The checkpoint ``path`` names: a save folder (its latest file), or one iteration folder.
    UsageError, one line, when it is not a checkpoint or not whole (a file missing or shorter
    than the manifest says: truncated)."""
    folder = Path(path)
    shown = f"{option} {os.fspath(path)}"
    if not folder.is_dir():
        what = "a file, not a folder" if folder.exists() else "no such folder"
        raise UsageError(f"{shown}: {what}; give a folder that `hwbench run --save` wrote")
    if not (folder / MANIFEST_FILE).is_file():
        folder = folder / iteration_folder_name(_latest_iteration(folder, shown))
        shown = f"{shown} ({folder.name})"
        if not folder.is_dir():
            raise UsageError(f"{shown}: {LATEST_FILE} names a checkpoint that is not there")
    manifest = _read_manifest(folder, shown)
    _check_files(folder, manifest, shown)
    return SavedCheckpoint(folder, manifest)


def _latest_iteration(folder: Path, shown: str) -> int:
    latest = folder / LATEST_FILE
    if not latest.is_file():
        raise UsageError(f"{shown} is not a checkpoint: it holds neither {LATEST_FILE} nor {MANIFEST_FILE}; give a "
                         "folder that `hwbench run --save` wrote, or one of its iter_NNNNNNN folders")
    text = latest.read_text(errors="replace").strip()
    if not text.isdigit():
        raise UsageError(f"{shown}: {LATEST_FILE} holds {text[:40]!r}, not an iteration number")
    return int(text)


def _read_manifest(folder: Path, shown: str) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        raise UsageError(f"{shown} is not a whole checkpoint: {MANIFEST_FILE} is missing") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"{shown}: {MANIFEST_FILE} cannot be read ({error}); the checkpoint is damaged") from None
    required = ("format", "version", "iteration", "engine", "model", "model_config", "layout", "data", "files")
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or any(
            key not in manifest for key in required):
        raise UsageError(f"{shown}: {MANIFEST_FILE} is not an hwbench checkpoint manifest")
    if manifest["version"] != MANIFEST_VERSION:
        raise UsageError(f"{shown}: manifest version {manifest['version']!r}; this hwbench reads version "
                         f"{MANIFEST_VERSION}")
    return manifest


def _check_files(folder: Path, manifest: dict[str, Any], shown: str) -> None:
    """Every file the manifest lists is there with its size: a copy cut short, or a file
    lost, is named before anything is loaded."""
    for name, size in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise UsageError(f"{shown} is truncated: {name} is missing")
        actual = path.stat().st_size
        if actual != size:
            raise UsageError(f"{shown} is truncated: {name} holds {actual:,} bytes, the manifest says {size:,}")


def check_resumable(saved: SavedCheckpoint, model: str, model_config: dict[str, Any], engine: str,
                    layout: dict[str, Any], fused_qkv: bool, option: str = "--load") -> None:
    """UsageError, one line naming what does not match, when this run cannot take ``saved``:
    another model's (any difference of shape), another engine's, DeepSpeed's in another layout
    (DeepSpeed loads its files into the layout that wrote them), or another q/k/v projection."""
    shown = f"{option} {saved.path}"
    manifest = saved.manifest
    differences = [f"{key} {manifest['model_config'].get(key)} here {value}" for key, value in model_config.items()
                   if manifest["model_config"].get(key) != value]
    if differences:
        raise UsageError(f"{shown} holds --model {manifest['model']} ({'; '.join(differences[:3])}), not this run's "
                         f"--model {model}; give a checkpoint of {model}")
    if manifest["engine"] != engine:
        raise UsageError(f"{shown} was saved by --engine {manifest['engine']}; load it with --engine "
                         f"{manifest['engine']}")
    if bool(manifest.get("fused_qkv")) != fused_qkv:
        saved_flag = "--fused-qkv" if manifest.get("fused_qkv") else "--no-fused-qkv"
        raise UsageError(f"{shown} was saved with {saved_flag}; give {saved_flag}")
    if engine == "deepspeed":
        saved_layout = {key: manifest["layout"].get(key) for key in layout}
        if saved_layout != layout:
            text = ", ".join(f"{key} {saved_layout[key]}" for key in layout)
            raise UsageError(f"{shown} was saved by DeepSpeed with {text}; DeepSpeed loads it only in that layout "
                             "(the native engine's checkpoints change layout)")


def sync_to_disk(*paths: Path) -> None:
    """Each file's bytes, or a folder's entries (a rename, a new file), flushed to the disk: a
    save is timed to here, so that its GB/s is the storage's and not the page cache's (the
    native engine's writer, torch.distributed.checkpoint's, does the same for its files)."""
    for path in paths:
        handle = os.open(path, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
