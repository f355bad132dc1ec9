"""An auditable archive of results, for procurement: `hwbench archive RESULTS... --out
FILE.tar.gz` and `hwbench archive --verify FILE` (docs/reports.md, "Archive").

The archive holds one folder, named after the file:

    <name>/results/<input>/...      every readable result, under the folder (or file) it was given as,
                                     with the logs and hwbench summaries beside it (*.log,
                                     aggregate.json, ranking.json)
    <name>/report.html               `hwbench report results --format html` over those files
    <name>/systems/system-N.json     the MLPerf-style description of each machine (hwbench system)
    <name>/archive.json              what is where: each run's file and machine, the files left out
    <name>/MANIFEST.sha256           the SHA-256 of every other file, as `sha256sum` writes it

so a colleague can check it with `sha256sum -c MANIFEST.sha256` or `hwbench archive --verify`,
and `hwbench report results --format html` in the unpacked folder gives report.html again.
Verifying reads the members without unpacking them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from hwbench.errors import UsageError

MANIFEST = "MANIFEST.sha256"
INDEX = "archive.json"
REPORT = "report.html"
SUFFIXES = (".tar.gz", ".tgz")
BESIDE_RESULTS = ("*.log", "aggregate.json", "ranking.json")  # copied from each result's folder


@dataclasses.dataclass
class ArchiveOutcome:
    path: Path
    results: int
    files: int  # in the manifest
    skipped: list[tuple[Path, str]]  # files that could not be read, with the reason


class ArchiveProblem(Exception):
    """An archive that does not match its manifest, or cannot be read: one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def archive_name(out: str | os.PathLike) -> str:
    name = Path(out).name
    for suffix in SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    raise UsageError(f"--out {os.fspath(out)!r} is not accepted; give a file name ending in .tar.gz")


def make_archive(paths: Iterable[str | os.PathLike], out: str | os.PathLike) -> ArchiveOutcome:
    """The archive of every result under ``paths``, written to ``out`` whole or not at all.
    UsageError for bad input: no results, a missing path, an ``out`` that is no .tar.gz or is
    one of the inputs."""
    from hwbench.files import atomic_file
    from hwbench.paths import check_output_file
    from hwbench.result.store import read_inputs

    inputs = [Path(path) for path in paths]
    name = archive_name(out)
    if not inputs:
        raise UsageError("RESULTS: give result files or folders of them")
    check_output_file(out, "--out", inputs)
    found, skipped = read_inputs(inputs, "RESULTS")
    if not found:
        extra = f" ({len(skipped)} unreadable: {skipped[0][1]})" if skipped else ""
        raise UsageError(f"RESULTS hold no readable hwbench result{extra}; nothing to archive")
    with tempfile.TemporaryDirectory(prefix=".hwbench-archive-") as staging:
        root = Path(staging) / name
        placed = _copy_results(found, inputs, root / "results")
        _write_systems_and_index(found, placed, skipped, root)
        _write_report(root)
        files = _write_manifest(root)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_file(out) as stream, tarfile.open(fileobj=stream, mode="w:gz") as tar:
                for path in sorted(root.rglob("*")):
                    tar.add(path, arcname=str(path.relative_to(staging)), recursive=False, filter=_plain)
        except OSError as error:
            raise UsageError(f"--out {os.fspath(out)}: cannot be written: {error.strerror or error}") from None
    return ArchiveOutcome(Path(out), len(found), files, skipped)


def _plain(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """Members without the packer's user and group: the archive says nothing of who made it."""
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def _input_names(paths: list[Path]) -> dict[Path, str]:
    """Each input's folder name in the archive: its own name, made distinct."""
    names: dict[Path, str] = {}
    for path in paths:
        base = (path.resolve().name if path.is_dir() else "") or "results"
        name, n = base, 1
        while name in names.values():
            n += 1
            name = f"{base}-{n}"
        names[path] = name
    return names


def _copy_results(found: list, paths: list[Path], target: Path) -> dict[str, str]:
    """Copy each result (and the logs and summaries beside it) under its input's name; the
    archive path of each run id."""
    names = _input_names(paths)
    placed: dict[str, str] = {}
    folders: set[tuple[Path, Path]] = set()
    for result, file in found:
        source = next((path for path in paths if path.is_dir() and file.resolve().is_relative_to(path.resolve())),
                      None)
        relative = file.resolve().relative_to(source.resolve()) if source else Path(file.name)
        destination = target / (names[source] if source else "") / relative
        _check_listable(destination.relative_to(target), file)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, destination)
        placed[result.run_id] = str(destination.relative_to(target.parent))
        folders.add((file.parent, destination.parent))
    for source_folder, destination_folder in sorted(folders):
        for pattern in BESIDE_RESULTS:
            for extra in sorted(source_folder.glob(pattern)):
                if extra.is_file() and not (destination_folder / extra.name).exists():
                    _check_listable(Path(extra.name), extra)
                    shutil.copyfile(extra, destination_folder / extra.name)
    return placed


def _check_listable(name: Path, source: Path) -> None:
    """A name the manifest can list: one line each, as sha256sum reads it, so no line break or
    other control character (a result named "x\\n<sha256>  y" would have forged a line)."""
    if not name.as_posix().isprintable():
        raise UsageError(f"RESULTS: {str(source)!r}: its name holds a line break or control character, which "
                         f"{MANIFEST} (one file a line) cannot list; rename it, or leave it out")


def _write_systems_and_index(found: list, placed: dict[str, str], skipped: list, root: Path) -> None:
    from hwbench import __version__
    from hwbench.report.system import system_description
    from hwbench.result.store import utc_now

    systems: list[dict] = []
    runs = []
    for result, _file in found:
        description = system_description(result)
        if description not in systems:
            systems.append(description)
        runs.append({"run_id": result.run_id, "status": result.status, "file": placed[result.run_id],
                     "system": f"systems/system-{systems.index(description) + 1}.json"})
    (root / "systems").mkdir(parents=True)
    for number, description in enumerate(systems, 1):
        (root / "systems" / f"system-{number}.json").write_text(json.dumps(description, indent=2) + "\n")
    index = {"hwbench_version": __version__, "created_at": utc_now(), "report": REPORT, "manifest": MANIFEST,
             "regenerate": f"hwbench report results --format html (in this folder) gives {REPORT}",
             "verify": f"sha256sum -c {MANIFEST}, or hwbench archive --verify <archive>",
             "runs": runs, "left_out": [{"file": str(path), "reason": reason} for path, reason in skipped]}
    (root / INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _write_report(root: Path) -> None:
    from hwbench.report import write_report

    text, _skipped = write_report([str(root / "results")], "html")
    (root / REPORT).write_text(text)


def _write_manifest(root: Path) -> int:
    files = sorted(path for path in root.rglob("*") if path.is_file())
    lines = [f"{_sha256(path.open('rb'))}  {path.relative_to(root).as_posix()}" for path in files]
    (root / MANIFEST).write_text("\n".join(lines) + "\n")
    return len(lines)


def _sha256(stream: IO[bytes]) -> str:
    digest = hashlib.sha256()
    with stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_archive(path: str | os.PathLike) -> int:
    """The number of files that match the archive's manifest; ArchiveProblem naming every file
    whose SHA-256 differs, that the manifest lists and the archive lacks, or that the archive
    holds and the manifest does not list; every member outside the archive's one folder (an
    absolute path, a '..', another folder) or that is no regular file or folder (a link, which
    would point an unpacked file elsewhere); or saying why the archive cannot be read."""
    archive = Path(path)
    if not archive.is_file():
        raise UsageError(f"--verify {os.fspath(path)!r}: not a file; give an archive hwbench archive wrote")
    try:
        hashes, manifest_text, top, problems = _member_hashes(archive)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise ArchiveProblem([f"{archive}: cannot be read as a .tar.gz (damaged or truncated): {error}"]) from None
    if manifest_text is None:
        raise ArchiveProblem([*problems, f"{archive}: holds no {top}/{MANIFEST}: not an archive hwbench archive wrote"])
    listed: dict[str, str] = {}
    for line in manifest_text.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            raise ArchiveProblem([*problems, f"{top}/{MANIFEST}: a line is not '<sha256>  <file>': {line[:80]!r}"])
        listed[name] = digest
    if not listed:
        problems.append(f"{top}/{MANIFEST}: lists no file (hwbench archive lists every file it writes)")
    problems += [f"{_shown(top, name)}: SHA-256 differs from the manifest (the file was changed)"
                 for name in sorted(listed) if name in hashes and hashes[name] != listed[name]]
    problems += [f"{_shown(top, name)}: listed in the manifest, missing from the archive"
                 for name in sorted(listed) if name not in hashes]
    problems += [f"{_shown(top, name)}: in the archive, not in the manifest (added)" for name in sorted(hashes)
                 if name not in listed]
    if problems:
        raise ArchiveProblem(problems)
    return len(listed)


def _shown(top: str, name: str) -> str:
    """A member's path for a problem's one line: a name with a line break or other control
    character as Python writes it, quoted."""
    text = f"{top}/{name}" if top else name
    return text if text.isprintable() else repr(text)


def _member_hashes(archive: Path) -> tuple[dict[str, str], str | None, str, list[str]]:
    """(each regular member's SHA-256 by its path under the top folder, the manifest's text, the
    top folder, the members refused: outside the top folder, or neither a regular file nor a
    folder). hwbench archive writes one folder of regular files and folders only."""
    hashes: dict[str, str] = {}
    manifest = None
    top = ""
    refused: list[str] = []
    with tarfile.open(archive, mode="r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            inside = bool(parts[0]) and ".." not in parts  # relative, never climbing
            top = top or (parts[0] if inside else "")
            if not inside or parts[0] != top:
                refused.append(f"{_shown('', member.name)}: outside the archive's folder {top}/ (unpacked, it would "
                               "land elsewhere)")
                continue
            rest = "/".join(parts[1:])
            if member.isdir():
                continue
            if not member.isfile():
                refused.append(f"{_shown(top, rest)}: a link or special file (hwbench archive writes regular files "
                               "only; unpacked, it could point elsewhere)")
                continue
            stream = tar.extractfile(member)
            assert stream is not None, "a regular file's member has a stream"
            if rest == MANIFEST:
                manifest = stream.read().decode("utf-8", errors="replace")
                continue
            hashes[rest] = _sha256(stream)
        while tar.fileobj.read(1 << 20):  # to the end of the gzip stream, whose checksum catches a changed byte
            pass
    return hashes, manifest, top, refused
