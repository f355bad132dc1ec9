"""Checkpoint folders as Megatron-LM names them, without torch (the spec checks `--load` with
it): what `--load` finds and checks before anything starts, and a save made whole before it
is named latest. An engine's state in them: state.py, native.py, deepspeed.py.

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
import re
import shutil
from pathlib import Path, PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwbench.errors import UsageError
from hwbench.fields import Count, Flag, Positive, Text, problem_text
from hwbench.files import write_json_atomic, write_text_atomic

LATEST_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's name
MANIFEST_FILE = "hwbench_checkpoint.json"
MANIFEST_FORMAT = "hwbench-checkpoint"
MANIFEST_VERSION = 1
PARTIAL_SUFFIX = ".partial"
RNG_FILE = "rng_rank_{rank:05d}.pt"
ITERATION_FOLDER = re.compile(r"iter_(\d+)")
MAX_ITERATION_DIGITS = 18  # a 64-bit counter's iterations: a longer number in the latest file is no iteration
FULL_BELOW_BYTES = 1 << 20  # free space under this after a failed write: the file system filled


class _Layout(BaseModel):
    model_config = ConfigDict(extra="allow")
    tp: Positive
    pp: Positive
    dp: Positive
    zero_stage: Literal[0, 1, 2, 3] = 0
    fsdp: Flag = False


class _DataPosition(BaseModel):
    model_config = ConfigDict(extra="allow")
    consumed_train_samples: Count
    consumed_valid_samples: Count


class Manifest(BaseModel):
    """What a manifest must hold for `--load` to use it, every field of the type it is read
    as: a damaged or hand-edited manifest is refused in one line naming the field, before
    any training starts, not met as a traceback half way through a load. Checked only; the
    manifest stays the mapping the file holds."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    format: Literal["hwbench-checkpoint"]
    version: Literal[1]
    iteration: Count
    engine: Literal["native", "deepspeed"]
    model: Text
    model_config_: dict[Text, Any] = Field(alias="model_config")
    fused_qkv: Flag = False
    layout: _Layout
    data: _DataPosition
    files: dict[Text, Count] = Field(min_length=1)  # a save lists at least its own state


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

    def data_position(self) -> dict[str, int]:
        """consumed_train_samples and consumed_valid_samples (Megatron-LM's names)."""
        return {key: int(self.manifest["data"][key]) for key in ("consumed_train_samples", "consumed_valid_samples")}


def find_checkpoint(path: str | os.PathLike) -> SavedCheckpoint:
    """The checkpoint ``path`` names: a save folder (its latest file), or one iteration folder.
    UsageError, one line, when it is not a checkpoint or not whole (a file missing or shorter
    than the manifest says: truncated)."""
    folder = Path(path)
    shown = f"--load {os.fspath(path)}"
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
    with latest.open("rb") as handle:  # its start: a number is short, and anything may have been put there
        text = handle.read(4096).decode(errors="replace").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_ITERATION_DIGITS:
        raise UsageError(f"{shown}: {LATEST_FILE} holds {text[:40]!r}, not an iteration number (digits 0-9, at most "
                         f"{MAX_ITERATION_DIGITS})")
    return int(text)


def _read_manifest(folder: Path, shown: str) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        raise UsageError(f"{shown} is not a whole checkpoint: {MANIFEST_FILE} is missing") from None
    except (OSError, ValueError, RecursionError) as error:
        raise UsageError(f"{shown}: {MANIFEST_FILE} cannot be read ({error}); the checkpoint is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise UsageError(f"{shown}: {MANIFEST_FILE} is not an hwbench checkpoint manifest")
    if manifest.get("version") != MANIFEST_VERSION or isinstance(manifest.get("version"), bool):
        raise UsageError(f"{shown}: manifest version {str(manifest.get('version'))[:40]!r}; this hwbench reads "
                         f"version {MANIFEST_VERSION}")
    try:
        Manifest.model_validate(manifest)
    except ValidationError as error:
        raise UsageError(f"{shown}: {MANIFEST_FILE} is damaged: {problem_text(error)}") from None
    match = ITERATION_FOLDER.fullmatch(folder.name)
    if match and int(match[1]) != manifest["iteration"]:
        raise UsageError(f"{shown}: {MANIFEST_FILE} says iteration {manifest['iteration']}, the folder's name "
                         f"{int(match[1])}; the checkpoint is damaged")
    return manifest


def _check_files(folder: Path, manifest: dict[str, Any], shown: str) -> None:
    """Every file the manifest lists is there with its size: a copy cut short, or a file
    lost, is named before anything is loaded."""
    for name, size in manifest["files"].items():
        parts = PurePath(name).parts
        path = folder / name
        if (not parts or PurePath(name).is_absolute() or ".." in parts or "\x00" in name
                or not path.resolve().is_relative_to(folder.resolve())):  # a link out of the folder too
            raise UsageError(f"{shown}: {MANIFEST_FILE} lists the file {name[:80]!r}, which is not inside the "
                             "checkpoint's folder; the checkpoint is damaged")
        if not path.is_file():
            raise UsageError(f"{shown} is truncated: {name} is missing")
        actual = path.stat().st_size
        if actual != size:
            raise UsageError(f"{shown} is truncated: {name} holds {actual:,} bytes, the manifest says {size:,}")


def check_resumable(saved: SavedCheckpoint, model: str, model_config: dict[str, Any], engine: str,
                    layout: dict[str, Any], fused_qkv: bool) -> None:
    """UsageError, one line naming what does not match, when this run cannot take ``saved``:
    another model's (any difference of shape), another engine's, DeepSpeed's in another layout
    (DeepSpeed loads its files into the layout that wrote them), or another q/k/v projection."""
    shown = f"--load {saved.path}"
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


# --- a save made whole, then named latest ---------------------------------------------------------


def commit(partial: Path, save_dir: Path, iteration: int, manifest: dict[str, Any]) -> Path:
    """Make the whole save at ``partial`` the checkpoint of ``iteration``: its manifest written
    last, then the rename, then the latest file. A folder of that iteration already there (an
    earlier run's) is replaced."""
    _write_manifest(partial, manifest)
    final = save_dir / iteration_folder_name(iteration)
    stale = final.with_name(final.name + ".replaced")
    if final.exists():
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
    os.replace(partial, final)
    shutil.rmtree(stale, ignore_errors=True)
    sync_to_disk(save_dir)  # the rename reaches the disk: a crash after it does not bring the old name back
    write_text_atomic(save_dir / LATEST_FILE, f"{iteration}\n")
    return final


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """The manifest of the save in ``folder``, listing every file there with its size; written last."""
    files = {str(path.relative_to(folder)): path.stat().st_size for path in sorted(folder.rglob("*"))
             if path.is_file() and path.name != MANIFEST_FILE}
    write_json_atomic(folder / MANIFEST_FILE,
                      {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, **manifest, "files": files})


def remove_partial_saves(save_dir: Path) -> None:
    """Remove what saves that never finished left in ``save_dir`` (a run killed mid-save)."""
    for leftover in sorted(save_dir.glob(f".iter_*{PARTIAL_SUFFIX}")) + sorted(save_dir.glob("iter_*.replaced")):
        shutil.rmtree(leftover, ignore_errors=True)


def failed_save(error: BaseException, save_dir: Path, iteration: int) -> str:
    """What a save that failed leaves: why (read before its partial folder is removed: a full
    disk shows) and which checkpoint is still the latest."""
    reason = _reason(error, save_dir)
    if not (save_dir / LATEST_FILE).is_file():
        before = "no earlier checkpoint in it"
    else:
        try:  # read as --load reads it: a failed save's message must not fail on a damaged file
            before = f"{iteration_folder_name(_latest_iteration(save_dir, str(save_dir)))} is still the latest, whole"
        except (OSError, UsageError) as unreadable:
            before = f"the latest file cannot be read ({unreadable})"
    return f"the checkpoint of step {iteration} could not be written to --save {save_dir}: {reason}; {before}"


def _reason(error: BaseException, save_dir: Path) -> str:
    """Why a write failed: the first OS reason inside the error (DCP gathers each rank's failure,
    as (exception, stack) pairs); else a full file system (torch's zip writer reports a disk that
    filled as a position mismatch, no OSError); else the error's first line."""
    seen: set[int] = set()
    stack: list[Any] = [error]
    while stack:
        current = stack.pop()
        if isinstance(current, tuple):
            stack += [item for item in current if isinstance(item, BaseException)]
            continue
        if id(current) in seen or current is None:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        stack += [getattr(current, "__cause__", None), getattr(current, "__context__", None)]
        failures = getattr(current, "failures", None)
        stack += list(failures.values()) if isinstance(failures, dict) else []
    try:
        free: int | None = shutil.disk_usage(save_dir).free
    except OSError:
        free = None
    if free is not None and free < FULL_BELOW_BYTES:
        return f"No space left on device ({free:,} bytes free)"
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
