"""`hwbench archive`: the archive round-trips (unpacked, its manifest checks out as sha256sum
would check it, and `hwbench report` over its results gives its report.html byte for byte), and
`--verify` names a changed, missing or added file, and a damaged archive, with exit 1."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from hwbench.cli import main


@pytest.fixture
def results(tmp_path, single_process_run) -> Path:
    """Two results (a real run and a repeat of it), a sweep log beside them and an unreadable file."""
    folder = tmp_path / "nightly"
    folder.mkdir()
    (folder / f"{single_process_run['run_id']}.json").write_text(json.dumps(single_process_run))
    repeat = {**single_process_run, "run_id": single_process_run["run_id"] + "-repeat"}
    (folder / f"{repeat['run_id']}.json").write_text(json.dumps(repeat))
    (folder / "repeat1.log").write_text("the point's log\n")
    (folder / "truncated.json").write_text('{"schema_version": 2, "run_id": "x"')
    return folder


def archive(capsys, *argv) -> tuple[int, str, str]:
    code = main(["archive", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def unpack(path: Path, into: Path) -> Path:
    with tarfile.open(path) as tar:
        members = tar.getmembers()
        assert all(not member.name.startswith("/") and ".." not in member.name.split("/") for member in members)
        tar.extractall(into, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (top,) = into.iterdir()
    return top


def test_the_archive_round_trips_and_its_report_is_regenerated(results, tmp_path, capsys):
    out = tmp_path / "delivery" / "h100-eval.tar.gz"
    code, printed, err = archive(capsys, results, "--out", out)
    assert code == 0 and "2 results" in printed
    assert "left out" in err and "truncated.json" in err  # named, skipped, as the report does
    top = unpack(out, tmp_path / "unpacked")
    assert top.name == "h100-eval"
    names = sorted(str(path.relative_to(top)) for path in top.rglob("*") if path.is_file())
    archived = [f"results/nightly/{path.name}" for path in results.glob("2*.json")]
    assert names == sorted(["MANIFEST.sha256", "archive.json", "report.html", "systems/system-1.json",
                            "results/nightly/repeat1.log", *archived])
    # the manifest, as `sha256sum -c MANIFEST.sha256` reads it
    lines = (top / "MANIFEST.sha256").read_text().splitlines()
    assert len(lines) == len(names) - 1
    for line in lines:
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((top / name).read_bytes()).hexdigest() == digest
    # the results as given, the machine as `hwbench system` describes it, what was left out
    for result in results.glob("2*.json"):
        assert (top / "results/nightly" / result.name).read_bytes() == result.read_bytes()
    index = json.loads((top / "archive.json").read_text())
    assert {run["file"] for run in index["runs"]} == {f"results/nightly/{p.name}" for p in results.glob("2*.json")}
    assert index["left_out"][0]["file"].endswith("truncated.json")
    assert main(["system", str(next(results.glob("2*.json")))]) == 0
    assert json.loads((top / "systems/system-1.json").read_text()) == json.loads(capsys.readouterr().out)
    # a colleague's report over the unpacked results is the archived page
    assert main(["report", str(top / "results"), "--format", "html", "--out", str(tmp_path / "again.html")]) == 0
    assert (tmp_path / "again.html").read_bytes() == (top / "report.html").read_bytes()
    code, printed, _ = archive(capsys, "--verify", out)
    assert code == 0 and f"all {len(lines)} files match the manifest" in printed


def repacked(source: Path, target: Path, change=None, drop: str | None = None, add: tuple[str, bytes] | None = None):
    """The archive again, with one member's bytes changed, one left out or one added."""
    with tarfile.open(source) as old, tarfile.open(target, "w:gz") as new:
        top = None
        for member in old:
            top = top or member.name.split("/")[0]
            data = old.extractfile(member).read() if member.isfile() else None
            if drop and member.name.endswith(drop):
                continue
            if change and member.isfile() and member.name.endswith(change[0]):
                data = change[1](data)
                member.size = len(data)
            new.addfile(member, io.BytesIO(data) if data is not None else None)
        if add:
            info = tarfile.TarInfo(f"{top}/{add[0]}")
            info.size = len(add[1])
            new.addfile(info, io.BytesIO(add[1]))
    return target


def flip_one_byte(data: bytes) -> bytes:
    index = data.index(b'"status"')
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1:]


def test_verify_names_each_file_that_does_not_match(results, tmp_path, capsys):
    out = tmp_path / "a.tar.gz"
    assert archive(capsys, results, "--out", out)[0] == 0
    victim = next(results.glob("2*.json")).name
    changed = repacked(out, tmp_path / "changed.tar.gz", change=(victim, flip_one_byte))
    code, _, err = archive(capsys, "--verify", changed)
    assert code == 1
    expected = f"hwbench archive: a/results/nightly/{victim}: SHA-256 differs from the manifest (the file was changed)"
    assert err.splitlines() == [expected]
    missing = repacked(out, tmp_path / "missing.tar.gz", drop="repeat1.log")
    code, _, err = archive(capsys, "--verify", missing)
    assert code == 1 and "a/results/nightly/repeat1.log: listed in the manifest, missing from the archive" in err
    added = repacked(out, tmp_path / "added.tar.gz", add=("results/nightly/extra.json", b"{}"))
    code, _, err = archive(capsys, "--verify", added)
    assert code == 1 and "a/results/nightly/extra.json: in the archive, not in the manifest (added)" in err


def test_verify_catches_a_changed_byte_of_the_file_itself(results, tmp_path, capsys):
    out = tmp_path / "a.tar.gz"
    assert archive(capsys, results, "--out", out)[0] == 0
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    code, _, err = archive(capsys, "--verify", out)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "damaged or truncated" in err


def with_member(source: Path, target: Path, member: tarfile.TarInfo, data: bytes = b"", listed: str | None = None):
    """The archive again with ``member`` added as it is named (not under the top folder) and,
    with ``listed``, a manifest line for it: the line --verify used to match it against."""
    line = f"{hashlib.sha256(data).hexdigest()}  {listed}\n".encode() if listed else b""
    repacked(source, target, change=("MANIFEST.sha256", lambda manifest: manifest + line))
    with tarfile.open(target) as old:
        members = [(m, old.extractfile(m).read() if m.isfile() else None) for m in old]
    with tarfile.open(target, "w:gz") as new:
        for old_member, old_data in members:
            new.addfile(old_member, io.BytesIO(old_data) if old_data is not None else None)
        member.size = len(data) if member.isfile() else 0
        new.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return target


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("member, listed, says", [
    # the first four passed: a member unpacked outside the folder, listed in the manifest under its own name;
    # a manifest outside the folder was read as the manifest
    (tarfile.TarInfo("../escaped.json"), "../escaped.json", "../escaped.json: outside the archive's folder a/"),
    (tarfile.TarInfo("a/../../escaped.json"), "../../escaped.json", "a/../../escaped.json: outside the archive's"),
    (tarfile.TarInfo("/tmp/escaped.json"), "/tmp/escaped.json", "/tmp/escaped.json: outside the archive's folder a/"),
    (tarfile.TarInfo("b/escaped.json"), "b/escaped.json", "b/escaped.json: outside the archive's folder a/"),
    (tarfile.TarInfo("../MANIFEST.sha256"), None, "../MANIFEST.sha256: outside the archive's folder a/"),
    # refused before, as "added" or "SHA-256 differs": a link is no file that was changed
    (_link("a/results/etc", "/etc"), None, "a/results/etc: a link or special file"),
    (_link("a/results/passwd", "/etc/passwd", tarfile.LNKTYPE), None, "a/results/passwd: a link or special file"),
], ids=["dotdot", "dotdot inside", "absolute", "another folder", "a manifest outside", "symlink", "hard link"])
def test_verify_refuses_members_outside_the_archive_s_folder_and_links(results, tmp_path, capsys, member, listed,
                                                                       says):
    out = tmp_path / "a.tar.gz"
    assert archive(capsys, results, "--out", out)[0] == 0
    hostile = with_member(out, tmp_path / "hostile.tar.gz", member, b"{}", listed)
    code, printed, err = archive(capsys, "--verify", hostile)
    assert code == 1 and printed == "", err
    assert any(line.startswith(f"hwbench archive: {says}") for line in err.splitlines()), err


def test_a_result_whose_name_holds_a_line_break_is_refused_not_listed(results, tmp_path, capsys):
    """The manifest lists a file a line: a name "x\\n<sha256>  y" would have forged a line."""
    first = next(results.glob("2*.json"))
    forged = results / f"run\n{'0' * 64}  report.html.json"
    forged.write_bytes(first.read_bytes().replace(b'"run_id": "', b'"run_id": "forged-'))
    before = sorted(tmp_path.rglob("*"))
    code, printed, err = archive(capsys, results, "--out", tmp_path / "a.tar.gz")
    assert code == 2 and printed == "" and len(err.strip().splitlines()) == 1, err
    assert f"RESULTS: {str(forged)!r}: its name holds a line break or control character" in err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("argv, message", [
    (["{results}", "--out", "{tmp}/a.zip"], "--out '{tmp}/a.zip' is not accepted; give a file name ending in .tar.gz"),
    (["{results}"], "--out FILE.tar.gz is needed"),
    ([], "RESULTS: give result files or folders of them"),
    (["{tmp}/missing", "--out", "{tmp}/a.tar.gz"], "RESULTS '{tmp}/missing': no such file or folder"),
    (["--verify", "{tmp}/missing.tar.gz"], "--verify '{tmp}/missing.tar.gz': not a file"),
    (["{results}", "--verify", "{tmp}/a.tar.gz"], "--verify FILE takes no RESULTS and no --out"),
    # packed everything, then a FileExistsError traceback when it came to make the folder
    (["{results}", "--out", "{tmp}/a-file/a.tar.gz"], "--out '{tmp}/a-file/a.tar.gz' lies under the file"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(results, tmp_path, capsys, argv, message):
    names = {"results": results, "tmp": tmp_path}
    (tmp_path / "a-file").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    code, out, err = archive(capsys, *(arg.format(**names) for arg in argv))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message.format(**names) in err
    assert sorted(tmp_path.rglob("*")) == before
