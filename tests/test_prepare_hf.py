"""`hwbench data prepare --tokenizer-model`: a Hugging Face tokenizer.json (Llama 3's layout) to
Megatron .bin/.idx data, int32 past 65500 ids, read back by hwbench and by megatron-core, and
trained on. The tokenizers are built here with HF tokenizers: nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hwbench.cli import main as hwbench_main
from hwbench.errors import UsageError
from hwbench.workload.indexed import IndexedDataset
from hwbench.workload.prepare import prepare
from hwbench.workload.tokenizer import huggingface

tokenizers = pytest.importorskip("tokenizers")

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "text" / "tinyshakespeare.txt"
FALLBACK_TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
                 "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 50
# Llama 3's layout: 128000 BPE ids, then 256 special tokens, the first two beginning and ending a text
LLAMA3_BPE_IDS, LLAMA3_VOCAB, BOS, EOD = 128_000, 128_256, 128_000, 128_001
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(254)]
TEXTS = ["Hello world", "First Citizen: speak, speak.", "", "naïve café ✓", "text with <|end_of_text|> inside",
         "  leading spaces\tand tabs\n\nand a blank line"]
RECORDS = [{"text": text} for text in TEXTS * 5]


def _training_text() -> str:
    return SHAKESPEARE.read_text()[:60_000] if SHAKESPEARE.is_file() else FALLBACK_TEXT


def _bpe_description(vocab_size: int) -> dict:
    """A byte-level BPE trained on a little Shakespeare, as tokenizer.json's dict."""
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([_training_text()], trainer)
    return json.loads(bpe.to_str())


def _with_specials(description: dict, first_special_id: int) -> dict:
    """The BPE padded to ``first_special_id`` ids, Llama 3's special tokens after them and its
    post-processor, which puts <|begin_of_text|> before every text."""
    vocab = description["model"]["vocab"]
    vocab.update({f"<unused_{i}>": i for i in range(len(vocab), first_special_id)})
    description["added_tokens"] = [
        {"id": first_special_id + i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, token in enumerate(SPECIALS)]
    bos = {"SpecialToken": {"id": SPECIALS[0], "type_id": 0}}
    description["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {SPECIALS[0]: {"id": SPECIALS[0], "ids": [first_special_id], "tokens": [SPECIALS[0]]}},
    }
    return description


def _tokenizer_folder(folder: Path, description: dict, eos_token: str | None = SPECIALS[1]) -> Path:
    """A model's tokenizer files as they come: tokenizer.json and, naming eos_token, tokenizer_config.json."""
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(description))
    if eos_token is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": eos_token}))
    return folder


@pytest.fixture(scope="module")
def llama3_like(tmp_path_factory) -> Path:
    """Llama 3's id layout (vocab 128256, BOS 128000, EOD 128001) over a small BPE."""
    folder = tmp_path_factory.mktemp("tokenizers") / "llama3-like"
    return _tokenizer_folder(folder, _with_specials(_bpe_description(400), LLAMA3_BPE_IDS))


def _jsonl(path: Path, records=RECORDS) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def _expected(folder: Path, texts, eod: int) -> list[list[int]]:
    """Each document as Megatron's preprocess_data.py writes it with --append-eod: the tokenizer's
    ids with its special tokens, then the end-of-document id."""
    reference = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [reference.encode(text).ids + [eod] for text in texts]


def test_a_llama3_layout_tokenizer_json_gives_llama3_ids(llama3_like):
    tokenizer = huggingface(llama3_like)
    assert (tokenizer.vocab_size, tokenizer.eod_id, tokenizer.name) == (LLAMA3_VOCAB, EOD, "huggingface")
    ids = tokenizer.encode("Hello world")
    assert ids[0] == BOS and max(ids[1:]) < 400  # <|begin_of_text|> first, as transformers adds it
    assert tokenizer.encode("a <|end_of_text|> b").count(EOD) == 1  # a special token in the text is that token
    assert tokenizer.encode("") == [BOS]
    assert huggingface(llama3_like / "tokenizer.json").encode("Hello world") == ids  # the file or its folder
    assert huggingface(llama3_like, eod_token="<|reserved_special_token_0|>").eod_id == 128_002
    assert tokenizer.decode(ids[1:]) == "Hello world"


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_writes_int32_data_equal_to_the_tokenizers_ids(tmp_path, llama3_like, workers):
    summary = prepare(_jsonl(tmp_path / "in.jsonl"), tmp_path / "llama", tokenizer_model=llama3_like,
                      append_eod=True, workers=workers)
    expected = _expected(llama3_like, [r["text"] for r in RECORDS], EOD)
    assert expected[2] == [BOS, EOD]  # an empty text is BOS then EOD: Megatron keeps every non-empty id list
    assert (summary["dtype"], summary["vocab_size"], summary["eod_id"]) == ("int32", LLAMA3_VOCAB, EOD)
    dataset = IndexedDataset(summary["outputs"]["text"])
    assert dataset.dtype == np.int32
    assert [dataset.get(i).tolist() for i in range(len(dataset))] == expected
    assert summary["tokens"] == dataset.num_tokens == sum(map(len, expected))


def test_megatron_core_reads_the_int32_data_token_for_token(tmp_path, llama3_like):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset",
                                  reason="megatron-core is not installed (pip install megatron-core)")
    summary = prepare(_jsonl(tmp_path / "in.jsonl"), tmp_path / "llama", tokenizer_model=llama3_like,
                      append_eod=True)
    theirs = indexed.IndexedDataset(summary["outputs"]["text"])
    assert theirs.index.dtype == np.int32
    expected = _expected(llama3_like, [r["text"] for r in RECORDS], EOD)
    assert [theirs[i].tolist() for i in range(len(theirs))] == expected
    assert theirs.document_indices.tolist() == list(range(len(RECORDS) + 1))


def test_the_cli_takes_megatrons_names_and_says_int32(tmp_path, llama3_like, capsys):
    source = _jsonl(tmp_path / "in.jsonl")
    assert hwbench_main(["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "m"),
                         "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                         str(llama3_like / "tokenizer.json"), "--append-eod", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "huggingface (vocab 128,256, eod 128001, appended)" in out and "int32" in out
    dataset = IndexedDataset(tmp_path / "m_text_document")
    assert dataset.get(0).tolist() == _expected(llama3_like, [TEXTS[0]], EOD)[0]


def test_without_an_eos_token_beside_it_eod_is_named_by_option(tmp_path, llama3_like):
    bare = _tokenizer_folder(tmp_path / "bare", json.loads((llama3_like / "tokenizer.json").read_text()),
                             eos_token=None)
    source = _jsonl(tmp_path / "in.jsonl", [{"text": "Hello"}])
    summary = prepare(source, tmp_path / "plain", tokenizer_model=bare)  # no eod asked for: none needed
    assert summary["eod_id"] is None
    summary = prepare(source, tmp_path / "named", tokenizer_model=bare, eod_token="<|end_of_text|>",
                      append_eod=True)
    assert IndexedDataset(summary["outputs"]["text"]).get(0).tolist() == _expected(bare, ["Hello"], EOD)[0]


def _refused(tmp_path, argv: list[str], capsys, *fragments: str) -> str:
    """`hwbench data prepare ARGV`: exit 2, one line naming what is wrong, nothing written."""
    before = sorted(p.name for p in tmp_path.iterdir())
    assert hwbench_main(["data", "prepare", "--output-prefix", str(tmp_path / "out" / "x"), "--quiet",
                         *argv]) == 2
    captured = capsys.readouterr()
    line = captured.err
    assert captured.out == "" and line.startswith("hwbench: error: ") and line.count("\n") == 1, line
    for fragment in fragments:
        assert fragment in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    return line


def test_bad_tokenizer_input_is_one_line_exit_2_and_nothing_written(tmp_path, llama3_like, capsys):
    source = str(_jsonl(tmp_path / "in.jsonl", [{"text": "Hello"}]))
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "gpt2-vocab.json").write_text('{"a": 0, "b": 1}')
    (tmp_path / "notes.txt").write_text("this is\nnot JSON\n")
    (tmp_path / "broken.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": 7}}')
    bare = _tokenizer_folder(tmp_path / "bare", json.loads((llama3_like / "tokenizer.json").read_text()),
                             eos_token=None)
    model = ["--input", source, "--tokenizer-model"]
    _refused(tmp_path, model + [str(tmp_path / "missing.json")], capsys,
             f"--tokenizer-model {tmp_path / 'missing.json'}: no such file", "tokenizer.json")
    _refused(tmp_path, model + [str(tmp_path / "empty-folder")], capsys, "the folder holds no tokenizer.json")
    _refused(tmp_path, model + [str(tmp_path / "notes.txt")], capsys, "notes.txt: line 1: not JSON")
    _refused(tmp_path, model + [str(tmp_path / "gpt2-vocab.json")], capsys, "without a tokenizer 'model'")
    _refused(tmp_path, model + [str(tmp_path / "broken.json")], capsys, "broken.json: not a tokenizer")
    # two tokenizers at once
    _refused(tmp_path, model + [str(llama3_like), "--vocab-file", "v.json", "--merge-file", "m.txt"], capsys,
             "--vocab-file and --merge-file apply to --tokenizer gpt2-bpe only")
    _refused(tmp_path, model + [str(llama3_like), "--tokenizer", "gpt2-bpe"], capsys,
             "--tokenizer-model applies to --tokenizer huggingface")
    _refused(tmp_path, ["--input", source, "--tokenizer", "huggingface"], capsys, "needs --tokenizer-model")
    _refused(tmp_path, ["--input", source, "--tokenizer", "byte", "--eod-token", "x"], capsys,
             "--eod-token applies to --tokenizer huggingface")
    # the end of a document
    _refused(tmp_path, model + [str(llama3_like), "--eod-token", "<|eot|>"], capsys,
             "--eod-token: '<|eot|>' is not a token of")
    _refused(tmp_path, model + [str(bare), "--append-eod"], capsys, "--append-eod", "--eod-token")


def test_llama_tiny_trains_on_int32_data_from_a_tokenizer_json(tmp_path, llama3_like):
    """Llama 3-vocabulary data (int32, ids up to 128001) trains --model llama-tiny, fp32, two steps."""
    summary = prepare(_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS * 40]), tmp_path / "llama",
                      tokenizer_model=llama3_like, append_eod=True)
    assert summary["dtype"] == "int32"
    out = tmp_path / "runs"
    assert hwbench_main(["run", "--quiet", "--model", "llama-tiny", "--precision", "fp32", "--seq-length", "32",
                         "--micro-batch-size", "2", "--global-batch-size", "2", "--data", summary["outputs"]["text"],
                         "--steps", "2", "--warmup", "0", "--eval-iters", "1", "--out", str(out)]) == 0
    result = json.loads(next(out.glob("*.json")).read_text())
    assert result["status"] == "ok", result.get("error")
    assert result["metrics"]["data"]["dtype"] == "int32"
    metrics = result["metrics"]
    assert np.isfinite([metrics["loss_start"], metrics["loss_end"], metrics["valid_loss"]]).all(), metrics
    # a fresh model over 128256 ids starts near ln(128256) = 11.76 (GPT-2's 50257: 10.83)
    assert metrics["loss_start"] == pytest.approx(np.log(LLAMA3_VOCAB), abs=0.1)


def test_llama_vocabulary_data_is_refused_by_a_gpt2_vocabulary_model_before_it_starts(tmp_path, llama3_like,
                                                                                         capsys):
    summary = prepare(_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS * 40]), tmp_path / "llama",
                      tokenizer_model=llama3_like, append_eod=True)
    out = tmp_path / "runs"
    assert hwbench_main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--data",
                         summary["outputs"]["text"], "--steps", "2", "--warmup", "0", "--out", str(out)]) == 2
    line = capsys.readouterr().err.splitlines()[-1]  # after the preflight's lines
    assert line.startswith("hwbench: error: --data ") and \
        "(train split): token id 128001 is outside the model's vocabulary of 50257" in line, line
    assert not out.exists()


@pytest.mark.heavy  # two ranks under torchrun; the one-process refusal above stays in the default run
def test_two_ranks_refuse_llama_vocabulary_data_as_one_process_does(tmp_path, llama3_like, capsys):
    """Each rank opens the data; its refusal reaches the launcher as bad input: exit 2, no result."""
    summary = prepare(_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS * 40]), tmp_path / "llama",
                      tokenizer_model=llama3_like, append_eod=True)
    out = tmp_path / "runs"
    assert hwbench_main(["run", "--quiet", "--model", "tiny", "--seq-length", "32", "--data",
                         summary["outputs"]["text"], "--steps", "2", "--warmup", "0", "--nproc-per-node", "2",
                         "--out", str(out)]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("hwbench: error: rank ") and "token id 128001 is outside the model's vocabulary" in line
    assert not out.exists()


def test_refusal_is_at_the_unpadded_vocabulary(tmp_path):
    """An id in the padding rows (50257..50303 for GPT-2) is no token of the model's tokenizer."""
    from hwbench.workload.data import DataError
    from hwbench.workload.gpt_dataset import MegatronData
    from hwbench.workload.indexed import write_indexed_dataset

    write_indexed_dataset(tmp_path / "d", [[1, 2, 3, 50257, 5, 6, 7, 8, 9]] * 8, "uint16")
    with pytest.raises(DataError, match="token id 50257 is outside the model's vocabulary of 50257"):
        MegatronData(str(tmp_path / "d"), "100,0,0", 4, micro_batch_size=2, global_batch_size=2, train_steps=2,
                     eval_iters=0, seed=1, vocab_size=50257)
    assert MegatronData(str(tmp_path / "d"), "100,0,0", 4, micro_batch_size=2, global_batch_size=2, train_steps=2,
                        eval_iters=0, seed=1, vocab_size=50258).train_batch()[0].max() == 50257


def test_transformers_autotokenizer_gives_the_same_ids(tmp_path, llama3_like):
    """What Megatron's HuggingFaceTokenizer runs (transformers' AutoTokenizer from the folder):
    the same ids, the same eos_token id and vocabulary size."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    theirs = transformers.AutoTokenizer.from_pretrained(str(llama3_like))
    ours = huggingface(llama3_like)
    assert (len(theirs), theirs.eos_token_id) == (ours.vocab_size, ours.eod_id)
    assert [theirs(text).input_ids for text in TEXTS] == ours.encode_batch(TEXTS)


def test_the_error_is_a_usage_error_from_the_api(tmp_path):
    source = _jsonl(tmp_path / "in.jsonl", [{"text": "Hello"}])
    with pytest.raises(UsageError, match="no such file"):
        prepare(source, tmp_path / "out", tokenizer_model=tmp_path / "nope.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
