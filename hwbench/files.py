"""Files hwbench writes (results, checkpoints, reports, exports, archives): whole or not at all,
and JSON as hwbench writes it. Imports nothing of hwbench.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def json_text(value: Any) -> str:
    """JSON as hwbench writes it: indented, a non-finite float as null, what JSON cannot hold as text."""
    return json.dumps(finite(value), indent=2, allow_nan=False, default=str)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float as null: JSON has no NaN, and a figure that
    is not a number was not measured."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def write_json_atomic(path: str | os.PathLike, value: Any, durable: bool = True) -> Path:
    """Every JSON file hwbench writes, through write_text_atomic. ``durable``: flushed
    to disk before the rename (results); False for files that are rewritten every step
    (heartbeats)."""
    return write_text_atomic(path, json_text(value) + "\n", durable)


def write_text_atomic(path: str | os.PathLike, text: str, durable: bool = True) -> Path:
    """A temporary file in the same folder, then renamed over the final name, so a
    reader sees the old file or the whole new one, never half (results, reports)."""
    with atomic_file(path, durable) as stream:
        stream.write(text.encode("utf-8"))
    return Path(path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary stream onto a temporary file in the same folder as ``path``, renamed over it
    when the block ends without an error and removed when it raises: every file hwbench
    writes (results, reports, exports, archives) appears whole or not at all."""
    final = Path(path)
    if final.exists() and not final.is_file():  # a rename would replace a device or a folder with this file
        raise OSError(errno.EEXIST, "it exists and is not a regular file", str(final))
    handle, temporary = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=".tmp", dir=final.parent)
    try:
        os.fchmod(handle, 0o666 & ~umask())  # mkstemp makes 0600; results are shared files
        with os.fdopen(handle, "wb") as stream:
            yield stream
            if durable:
                stream.flush()
                os.fsync(stream.fileno())
        os.replace(temporary, final)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def umask() -> int:
    """The process umask, read without changing it (os.umask would, for a moment,
    for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
