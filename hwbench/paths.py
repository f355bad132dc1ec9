"""Where result files are: found under the paths a command is given, and the output paths a
command writes to, checked before anything runs. Knows nothing of a result's contents, so the
spec, the calibration store and every command can check their paths without the result model."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from hwbench.checkpoint import MANIFEST_FILE
from hwbench.errors import UsageError

# hwbench's own summaries that live beside results: a sweep point's repeat statistics,
# `hwbench tune`'s ranking; and a checkpoint's manifest, for a --save folder under --out.
# Folders are searched for results without them.
AGGREGATE_FILE = "aggregate.json"
RANKING_FILE = "ranking.json"
NOT_RESULTS = (AGGREGATE_FILE, RANKING_FILE, MANIFEST_FILE)
def result_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Result files named directly or found (recursively) in folders (hidden files,
    hwbench's own summaries and checkpoint manifests left out). One path given as a str or PathLike is one path."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            found += sorted(p for p in entry.rglob("*.json")
                            if not p.name.startswith(".") and p.name not in NOT_RESULTS)
        else:
            found.append(entry)
    unique = {path.resolve(): path for path in reversed(found)}  # a file named twice is read once
    return [path for path in found if unique.get(path.resolve()) is path]


def check_output_folder(folder: str | os.PathLike, option: str = "--out") -> Path:
    """Refuse, before anything runs, an output folder hwbench could not write: empty,
    a file, under a file, or not writable (a read-only file system, no permission).
    Probed by creating and removing a file in the folder, or in its nearest existing
    ancestor when it does not exist yet, so nothing is left behind either way."""
    text = os.fspath(folder)
    if not text.strip():
        raise UsageError(f"{option} {text!r} is not accepted; give a directory (it is created when missing)")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {text!r} is a file; give a directory (it is created when missing)")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {text!r} lies under the file {str(existing)!r}; give a directory")
    try:
        handle, probe = tempfile.mkstemp(prefix=".hwbench-probe-", dir=existing)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise UsageError(f"{option} {text!r} cannot be written ({error.strerror} in {str(existing)!r}); give a "
                         "writable directory") from None
    return path


def check_output_file(path: str | os.PathLike, option: str, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse, before anything is read, an output file that would destroy something: one
    of the command's own input files, or an existing path that is not a regular file
    (a folder, a device such as /dev/full); an empty path; a path under a file (found here,
    not after the work that fills it)."""
    text = os.fspath(path)
    if not text.strip():
        raise UsageError(f"{option} {text!r} is not accepted; give a file path")
    final = Path(text)
    existing = final.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise UsageError(f"{option} {text!r} lies under the file {str(existing)!r}; give a file path in a folder")
    if final.exists() and not final.is_file():
        raise UsageError(f"{option} {os.fspath(path)!r} exists and is not a regular file; give a file path")
    for source in result_files(inputs):
        if final.exists() and source.exists() and os.path.samefile(final, source):
            raise UsageError(f"{option} {os.fspath(path)!r} is one of the input files; give another path, or the "
                             "input would be overwritten")
    return final
