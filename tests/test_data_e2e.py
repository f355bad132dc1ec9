"""`hwbench data prepare` then `hwbench run --data`: real text, falling validation PPL."""

import json
from pathlib import Path

import pytest

from hwbench.cli import main

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
TEXT = SHARED / "text" / "tinyshakespeare.txt"
VOCAB, MERGES = SHARED / "gpt2" / "gpt2-vocab.json", SHARED / "gpt2" / "gpt2-merges.txt"

needs_shared = pytest.mark.skipif(not (TEXT.exists() and VOCAB.exists() and MERGES.exists()),
                                  reason="../shared/data (tinyshakespeare and the GPT-2 tokenizer files) is absent")


@needs_shared
def test_prepare_then_train_reports_a_falling_validation_ppl(tmp_path, capsys):
    prefix = tmp_path / "shakespeare"
    assert main(["data", "prepare", "--input", str(TEXT), "--tokenizer", "gpt2-bpe", "--vocab-file", str(VOCAB),
                 "--merge-file", str(MERGES), "--append-eod", "--quiet", "--output-prefix", str(prefix)]) == 0
    data = f"{prefix}_text_document"
    out = tmp_path / "runs"
    assert main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--data", data, "--steps", "12",
                 "--warmup", "0", "--eval-interval", "4", "--eval-iters", "2", "--out", str(out)]) == 0
    result = json.loads(next(out.glob("*.json")).read_text())
    assert result["metrics"]["data"]["kind"] == "megatron-indexed"
    assert result["metrics"]["data"]["split_documents"]["valid"] > 0
    points = result["metrics"]["validation"]
    assert [p["step"] for p in points] == [4, 8, 12]
    ppls = [p["ppl"] for p in points]
    assert ppls[0] > ppls[1] > ppls[2], ppls
    assert result["metrics"]["ppl_floor"] is None  # unknown for real text: null, not guessed
    assert "PPL" in capsys.readouterr().out
    # the index cache lands next to the data and is reused by the next run
    assert list(Path(f"{data}_cache").glob("train_*.npz"))


def test_bad_data_prefix_is_one_line_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["run", "--quiet", "--model", "tiny", "--data", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert "--data" in line and "nothing.idx" in line and "builtin" in line
    assert not out.exists()


def test_split_without_training_documents_is_bad_input(tmp_path, capsys):
    from hwbench.workload.indexed import write_indexed_dataset

    write_indexed_dataset(tmp_path / "d", [[1, 2, 3, 4, 5]] * 10, "uint16")
    out = tmp_path / "runs"
    assert main(["run", "--quiet", "--model", "tiny", "--data", str(tmp_path / "d"), "--split", "0,1,0",
                 "--out", str(out)]) == 2
    assert "no training documents" in capsys.readouterr().err
    assert not out.exists()
