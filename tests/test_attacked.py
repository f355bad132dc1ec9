"""What an attack on the newer commands found outside the history and calibration modules (their
own tests hold the rest): each case a hostile or careless input that used to misbehave, now refused
in one line with nothing written (docs/reliability.md lists them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwbench.cli import main
from hwbench.errors import UsageError

DATA = Path(__file__).parent / "data"


def _one_line_exit_2(capsys, argv, *expected) -> str:
    code = main([str(arg) for arg in argv])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


def test_prepare_refuses_more_workers_than_cores_before_starting_one(tmp_path, capsys):
    """--workers 100000 used to fork 100,000 tokenizer processes on a 2-core machine."""
    from hwbench.device.host import usable_cores

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "abc"}) + "\n")
    cores = usable_cores()
    _one_line_exit_2(capsys, ["data", "prepare", "--input", source, "--output-prefix", tmp_path / "out",
                              "--tokenizer", "byte", "--workers", cores + 1],
                     f"--workers {cores + 1}: give 1 to {cores} (the cores this process may use)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_prepare_refuses_an_output_that_is_a_folder_before_tokenizing(tmp_path, capsys):
    """The .bin is renamed over its final name at the end: a folder there was a traceback."""
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "abc"}) + "\n")
    (tmp_path / "out_text_document.bin").mkdir()
    _one_line_exit_2(capsys, ["data", "prepare", "--input", source, "--output-prefix", tmp_path / "out",
                              "--tokenizer", "byte"], "out_text_document.bin exists and is not a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out_text_document.bin"]


def test_load_results_refuses_a_path_that_does_not_exist_as_the_commands_do():
    """A typo used to give an empty DataFrame without a word."""
    import hwbench

    with pytest.raises(UsageError, match="paths 'no_such_folder': no such file or folder"):
        hwbench.load_results("no_such_folder")
    assert len(hwbench.load_results(DATA / "history" / "noise")) == 20
