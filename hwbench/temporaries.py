"""Temporary files that name the process writing them, so that the next writer can remove
those a killed one left behind.

A writer that builds a file under a temporary name and renames (or links) it into place
cleans up after itself when it fails or is interrupted; one killed outright (SIGKILL, the
OOM killer, a power cut) runs no cleanup. Its temporaries are named
``PREFIX<host>-<pid>-XXXXXXXX<suffix>`` (``writer_temporary``), and the next writer of the
same PREFIX removes those whose process is gone (``remove_stale_temporaries``): on this host
only, since another host's process ids mean nothing here, and never a living writer's.

Imports nothing of hwbench: the dataset writer and the history store both use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
from collections.abc import Iterator

# what SQLite keeps beside a database file while it writes (its rollback journal), so a
# database built under a temporary name leaves NAME.tmp-journal too when killed mid-write
COMPANIONS = ("-journal", "-wal", "-shm")


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


def writer_temporary(folder: str | os.PathLike, prefix: str, suffix: str = ".tmp") -> str:
    """An empty file ``PREFIX<host>-<pid>-XXXXXXXX<suffix>`` in ``folder`` (mkstemp: created
    exclusively, mode 0600); its path. OSError as mkstemp raises it."""
    handle, path = tempfile.mkstemp(dir=folder, prefix=f"{prefix}{_host()}-{os.getpid()}-", suffix=suffix)
    os.close(handle)
    return path


def remove_stale_temporaries(folder: str | os.PathLike, prefix: str, suffix: str = ".tmp") -> list[str]:
    """Remove the temporaries ``PREFIX...SUFFIX`` in ``folder`` (and SQLite's companions of them,
    ``...SUFFIX-journal``) of writers that are gone: named by this host and a process that no
    longer exists, or named by no process at all (an older writer's ``PREFIX<random>SUFFIX``).
    Another host's, and a living process's, are left alone. Returns the names removed."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for entry in sorted(entries):
        if not entry.startswith(prefix):
            continue
        stem = next((entry[:-len(suffix + companion)] for companion in ("", *COMPANIONS)
                     if entry.endswith(suffix + companion)), None)
        if stem is None or _writer_may_live(stem[len(prefix):]):
            continue
        try:
            os.remove(os.path.join(folder, entry))
            removed.append(entry)
        except OSError:
            pass  # gone already, or not ours to remove
    return removed


def _writer_may_live(name: str) -> bool:
    """From ``<host>-<pid>-<random>`` (or ``<pid>-<random>``, or ``<random>``): whether the writer
    may still be running. Another host's writer is taken to live."""
    owner, _, _random = name.rpartition("-")
    host, _, pid = owner.rpartition("-")
    if not pid.isdigit():
        return False  # a writer that named no process: an older hwbench's, left by a crash
    if host and host != _host():
        return True
    return process_alive(int(pid))


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


def process_alive(pid: int) -> bool:
    """Whether a process of this id exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait while inside (delivered on leaving): for making a
    temporary and naming it, or removing one with its companions, which a stop must not cut
    in half. The calling thread only; a no-op where signals cannot be masked."""
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
