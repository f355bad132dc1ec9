"""Tokenizers and `hwbench data prepare`: text to a Megatron .bin/.idx dataset."""

import gzip
import io
import json
import lzma
import re
from pathlib import Path

import numpy as np
import pytest

from hwbench.cli import run_command
from hwbench.errors import UsageError
from hwbench.workload import prepare as prepare_module
from hwbench.workload.indexed import IndexedDataset, IndexedDatasetWriter
from hwbench.workload.prepare import Chunk, ChunkEncoder, PrepareOptions, encode_chunks, prepare
from hwbench.workload.tokenizer import TokenizerError, byte_level, gpt2_bpe


def main(argv):
    return run_command("data", ["prepare", *argv])

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GPT2 = SHARED_DATA / "gpt2"
SHAKESPEARE = SHARED_DATA / "text" / "tinyshakespeare.txt"

needs_gpt2 = pytest.mark.skipif(not (GPT2 / "gpt2-vocab.json").is_file(),
                                reason=f"GPT-2 tokenizer files not found at {GPT2} (reference data beside the project)")

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "", "naïve café — ünïcödé ✓",
         "  leading spaces\tand\ttabs", "<|endoftext|> is text here"]


@pytest.fixture(scope="module")
def gpt2():
    if not (GPT2 / "gpt2-vocab.json").is_file():
        pytest.skip(f"GPT-2 tokenizer files not found at {GPT2} (reference data beside the project)")
    return gpt2_bpe(GPT2 / "gpt2-vocab.json", GPT2 / "gpt2-merges.txt")


def gpt2_files():
    return {"vocab_file": GPT2 / "gpt2-vocab.json", "merge_file": GPT2 / "gpt2-merges.txt"}


def write_jsonl(path, records):
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "wt", encoding="utf-8") as stream:
        for record in records:
            stream.write(json.dumps(record) + "\n")
    return path


def names(folder):
    return sorted(p.name for p in folder.iterdir())


def tokens_of(prefix):
    dataset = IndexedDataset(prefix)
    return [dataset.get(i).tolist() for i in range(len(dataset))], dataset


# --- tokenizers -----------------------------------------------------------------------------


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert (gpt2.eod_id, gpt2.vocab_size, gpt2.name) == (50256, 50257, "gpt2-bpe")
    assert gpt2.encode(" Hello") == [18435]  # the leading space is part of the token; none is added
    assert 50256 not in gpt2.encode("<|endoftext|>")  # no special processing: it is plain text
    assert gpt2.encode_batch(TEXTS) == [gpt2.encode(t) for t in TEXTS]
    assert [gpt2.decode(ids) for ids in gpt2.encode_batch(TEXTS)] == TEXTS
    tokens, lengths = gpt2.encode_batch_arrays(TEXTS, np.uint16)
    assert tokens.dtype == np.uint16 and tokens.tolist() == [t for ids in gpt2.encode_batch(TEXTS) for t in ids]
    assert lengths.tolist() == [len(gpt2.encode(t)) for t in TEXTS]


def test_byte_level_tokenizer():
    tokenizer = byte_level()
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (257, 256)
    assert tokenizer.encode("hé") == [104, 195, 169]
    tokens, lengths = tokenizer.encode_batch_arrays(["ab", "", "é"])
    assert tokens.tolist() == [97, 98, 195, 169] and lengths.tolist() == [2, 0, 2]
    assert tokenizer.decode(tokenizer.encode("naïve")) == "naïve"


def _tokenizer_files(tmp_path, vocab, merges):
    vocab_path, merges_path = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab_path.write_text(vocab if isinstance(vocab, str) else json.dumps(vocab, indent=1))
    merges_path.write_text(merges)
    return vocab_path, merges_path


SMALL_VOCAB = {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}


def test_a_small_consistent_bpe_works(tmp_path):
    tokenizer = gpt2_bpe(*_tokenizer_files(tmp_path, SMALL_VOCAB, "#version: 0.2\na b\n"))
    assert tokenizer.encode("abba") == [2, 1, 0]
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (4, 3)


@pytest.mark.parametrize("vocab,merges,culprit,fragments", [
    (SMALL_VOCAB, "#version: 0.2\na b\nab c\n", "merges", ["line 3", "'c'", "do not match"]),
    ({"a": 0, "b": 1, "<|endoftext|>": 2}, "#version: 0.2\na b\n", "merges", ["line 2", "'ab'", "do not match"]),
    (SMALL_VOCAB, "a b\n", "merges", ["line 1", "#version"]),
    (SMALL_VOCAB, "#version: 0.2\na b\nab\n", "merges", ["line 3", "two tokens"]),
    (SMALL_VOCAB, "#version: 0.2\na  b\n", "merges", ["line 2", "two tokens"]),
    ('{\n "a": 0,\n "b": 1\n "ab": 2\n}', "#version: 0.2\na b\n", "vocab", ["line 4", "not JSON"]),
    ('["a", "b"]', "#version: 0.2\n", "vocab", ["expected a JSON object"]),
    ({"a": 0, "b": "one"}, "#version: 0.2\n", "vocab", ["line 3", "'b'", "non-negative integers"]),
    ({"a": 0, "b": 2}, "#version: 0.2\n", "vocab", ["id 1 is missing"]),
    ({"a": 0, "b": 1}, "#version: 0.2\n", "vocab", ["<|endoftext|>"]),
])
def test_bad_tokenizer_files_name_the_file_and_line(tmp_path, vocab, merges, culprit, fragments):
    vocab_path, merges_path = _tokenizer_files(tmp_path, vocab, merges)
    with pytest.raises(TokenizerError) as caught:
        gpt2_bpe(vocab_path, merges_path)
    message = str(caught.value)
    assert isinstance(caught.value, UsageError) and "\n" not in message
    assert message.startswith(str(merges_path if culprit == "merges" else vocab_path) + ":"), message
    for fragment in fragments:
        assert fragment in message, message


def test_missing_tokenizer_files(tmp_path):
    with pytest.raises(UsageError, match="needs --vocab-file and --merge-file"):
        prepare(write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}]), tmp_path / "out")
    with pytest.raises(TokenizerError, match=r"nope\.json: no such file"):
        gpt2_bpe(tmp_path / "nope.json", tmp_path / "nope.txt")


# --- prepare: outputs ---------------------------------------------------------------------------


RECORDS = [{"text": text, "title": f"doc {i}"} for i, text in enumerate(TEXTS * 30)]


@needs_gpt2
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json.xz"])
def test_prepare_jsonl_matches_the_tokenizer_with_eod(tmp_path, gpt2, suffix):
    source = write_jsonl(tmp_path / f"in{suffix}", RECORDS)
    (tmp_path / "out").mkdir()
    summary = prepare(source, tmp_path / "out" / "corpus", append_eod=True, **gpt2_files())
    assert names(tmp_path / "out") == ["corpus_text_document.bin", "corpus_text_document.idx"]
    sequences, dataset = tokens_of(summary["outputs"]["text"])
    expected = [gpt2.encode(r["text"]) + [50256] for r in RECORDS if r["text"]]  # empty: no eod, as Megatron
    assert sequences == expected
    assert dataset.num_documents == len(RECORDS) == summary["documents"]
    assert dataset.dtype == np.uint16 and summary["dtype"] == "uint16"
    assert summary["tokens"] == sum(map(len, expected)) == dataset.num_tokens


@needs_gpt2
def test_workers_give_identical_outputs_and_several_keys_their_own_files(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "CHUNK_DOCUMENTS", 7)  # many chunks, so order matters
    source = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    outputs = {}
    for workers in (1, 2):
        summary = prepare(source, tmp_path / f"w{workers}", json_keys=["text", "title"], append_eod=True,
                          workers=workers, **gpt2_files())
        assert summary["workers"] == workers
        outputs[workers] = {p: Path(p).read_bytes() for p in summary["files"]}
    assert [Path(p).name for p in outputs[2]] == ["w2_text_document.bin", "w2_text_document.idx",
                                                 "w2_title_document.bin", "w2_title_document.idx"]
    assert list(outputs[1].values()) == list(outputs[2].values())
    titles, _ = tokens_of(tmp_path / "w2_title_document")
    assert len(titles) == len(RECORDS)


@pytest.mark.parametrize("mode,expected", [
    ("paragraph", ["one\ntwo", "three", "four\r\nfive"]),
    ("line", ["one", "two", "three", "four", "five"]),
    ("file", ["one\ntwo\n\n\nthree\n  \nfour\r\nfive\n"]),
])
def test_plain_text_documents(tmp_path, mode, expected):
    source = tmp_path / "in.txt"
    source.write_bytes(b"one\ntwo\n\n\nthree\n  \nfour\r\nfive\n")
    summary = prepare(source, tmp_path / "t", tokenizer="byte", text_document=mode)
    sequences, _ = tokens_of(summary["outputs"]["text"])
    assert [bytes(s).decode() for s in sequences] == expected
    assert summary["documents"] == len(expected)


def test_byte_tokenizer_with_eod_and_gzip_text(tmp_path):
    source = tmp_path / "in.txt.gz"
    with gzip.open(source, "wt", encoding="utf-8") as stream:
        stream.write("first paragraph\nstill first\n\nsecond é\n")
    summary = prepare(source, tmp_path / "b", tokenizer="byte", append_eod=True)
    sequences, dataset = tokens_of(summary["outputs"]["text"])
    assert sequences == [list(b"first paragraph\nstill first") + [256], list("second é".encode()) + [256]]
    assert summary["vocab_size"] == 257 and dataset.dtype == np.uint16


def test_progress_line_and_summary_table(tmp_path, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "abc"}, {"text": "de"}])
    stream = io.StringIO()
    prepare(source, tmp_path / "p", tokenizer="byte", progress=True, progress_stream=stream)
    assert re.fullmatch(r"prepare: 2 documents  5 tokens  [\d,]+ tokens/s\n", stream.getvalue())
    assert main(["--input", str(source), "--output-prefix", str(tmp_path / "m"), "--tokenizer", "byte",
                 "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    for row in ("documents", "tokens", "seconds", "tokens/s", "tokens/s per worker", "output"):
        assert re.search(rf"^{re.escape(row)}\s", out.out, re.M), out.out
    assert str(tmp_path / "m_text_document.idx") in out.out


def test_the_hwbench_cli_runs_it(tmp_path, capsys):
    from hwbench.cli import main as hwbench_main

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "abc"}])
    assert hwbench_main(["data", "prepare", "--input", str(source), "--output-prefix", str(tmp_path / "c"),
                         "--tokenizer", "byte", "--quiet"]) == 0
    assert IndexedDataset(tmp_path / "c_text_document").num_tokens == 3
    assert hwbench_main(["data", "prepare", "--input", str(tmp_path / "missing.jsonl"), "--output-prefix",
                         str(tmp_path / "c2"), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    assert err == f"hwbench: error: --input {tmp_path / 'missing.jsonl'}: no such file\n"


# --- prepare: bad input -----------------------------------------------------------------------


def _fails(tmp_path, source, *fragments, **options):
    before = names(tmp_path)
    with pytest.raises(UsageError) as caught:
        prepare(source, tmp_path / "bad", **{"tokenizer": "byte", **options})
    message = str(caught.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert names(tmp_path) == before  # no output, no temporaries
    return message


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_json_lines_name_file_and_line(tmp_path, workers):
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(40)]
    source.write_text("\n".join(lines[:30] + ["{not json"] + lines[30:]) + "\n")
    _fails(tmp_path, source, f"{source}: line 31: not JSON", workers=workers)
    source.write_text("\n".join(lines[:5] + ['{"body": "x"}']) + "\n")
    _fails(tmp_path, source, f"{source}: line 6: no key 'text'", "'body'", "--json-keys", workers=workers)
    source.write_text('{"text": "a"}\n[1, 2]\n')
    _fails(tmp_path, source, f"{source}: line 2: expected a JSON object, found a list")
    source.write_text('{"text": "a"}\n{"text": null}\n')
    _fails(tmp_path, source, f"{source}: line 2: key 'text' holds null, not a string")


def test_invalid_utf8_names_line_and_byte_offset(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    _fails(tmp_path, source, f"{source}: line 2 (byte offset 28): invalid UTF-8")
    text = tmp_path / "in.txt"
    text.write_bytes(b"fine\nparagraph\n\nsecond\nbad \xff here\n")
    _fails(tmp_path, text, f"{text}: line 5 (byte offset 27): invalid UTF-8")


def test_lone_surrogate_escape_is_refused(tmp_path, gpt2):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "fine"}, {"text": "bad \ud800"}])
    _fails(tmp_path, source, f"{source}: line 2", "surrogate", tokenizer="gpt2-bpe", **gpt2_files())


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_an_input_without_documents(tmp_path, content, suffix):
    source = tmp_path / f"empty{suffix}"
    source.write_bytes(content)
    _fails(tmp_path, source, f"{source}: no documents")


def test_bad_options_and_files(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    _fails(tmp_path, tmp_path / "missing.jsonl", f"--input {tmp_path / 'missing.jsonl'}: no such file")
    odd = tmp_path / "in.dat"
    odd.write_text("x")
    _fails(tmp_path, odd, "cannot tell JSON lines from plain text", "--input-format")
    _fails(tmp_path, source, "--workers 0", workers=0)
    _fails(tmp_path, source, "--text-document applies to plain-text input", text_document="line")
    _fails(tmp_path, source, "--vocab-file and --merge-file apply to --tokenizer gpt2-bpe",
           vocab_file=tmp_path / "v.json")
    corrupt = tmp_path / "in.jsonl.gz"
    corrupt.write_bytes(gzip.compress(b'{"text": "a"}\n' * 1000)[:-30])
    _fails(tmp_path, corrupt, f"{corrupt}: cannot read past line")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UsageError, match="afile is a file, not a folder"):
        prepare(source, tmp_path / "afile" / "sub" / "out", tokenizer="byte")
    with pytest.raises(UsageError, match="the following arguments are required: --input"):
        main(["--output-prefix", "x"])


def test_a_missing_output_folder_is_created_and_removed_again_on_failure(tmp_path, capsys):
    """The README's `--output-prefix data/corpus` on a fresh clone: the folder is made; a
    failed prepare leaves no folder it made behind."""
    from hwbench.cli import main as hwbench_main

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "abc"}])
    prefix = tmp_path / "data" / "deeper" / "corpus"
    assert hwbench_main(["data", "prepare", "--input", str(source), "--output-prefix", str(prefix),
                         "--tokenizer", "byte", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert IndexedDataset(f"{prefix}_text_document").num_tokens == 3
    assert f"hwbench run --data {prefix}_text_document" in out  # what to give `run` next
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"other": "abc"}])
    with pytest.raises(UsageError, match="no key 'text'"):
        prepare(bad, tmp_path / "made" / "for" / "it", tokenizer="byte")
    assert not (tmp_path / "made").exists()


@pytest.mark.parametrize("line, fragment", [
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", "JSON nested too deeply"),
    ('{"text": "a", "n": ' + "9" * 5000 + "}", "a JSON number too long to read"),
])
@pytest.mark.parametrize("workers", [1, 2])
def test_pathological_json_lines_are_one_line_errors(tmp_path, line, fragment, workers):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "fine"}) + "\n" + line + "\n")
    message = _fails(tmp_path, source, f"{source}: line 2: {fragment}", workers=workers)
    assert len(message) < 300, message


def test_run_names_the_dataset_prepare_wrote_for_a_prefix(tmp_path):
    from hwbench.spec import check_data

    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "abc"}])
    prepare(source, tmp_path / "shakes", tokenizer="byte")
    with pytest.raises(UsageError) as caught:
        check_data(str(tmp_path / "shakes"))
    assert f"give --data {tmp_path / 'shakes'}_text_document" in str(caught.value)
    assert check_data(f"{tmp_path / 'shakes'}_text_document") == f"{tmp_path / 'shakes'}_text_document"


def test_stale_temporaries_of_a_killed_writer_are_removed(tmp_path):
    """A writer killed outright leaves NAME.bin.PID-XXXX.tmp; the next writer of the same prefix
    removes those of dead processes (and of writers that named none), not a living writer's."""
    import os
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [
        tmp_path / f"out_text_document.bin.{dead.pid}-abc.tmp",
        tmp_path / f"out_text_document.idx.{dead.pid}-abc.tmp",
        tmp_path / "out_text_document.bin.q1w2e3r4.tmp",
    ]
    living = tmp_path / f"out_text_document.bin.{os.getppid()}-xyz.tmp"
    other = tmp_path / f"other_text_document.bin.{dead.pid}-abc.tmp"
    for path in stale + [living, other]:
        path.write_bytes(b"partial")
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "abc"}])
    prepare(source, tmp_path / "out", tokenizer="byte")
    assert names(tmp_path) == sorted(
        ["in.jsonl", "out_text_document.bin", "out_text_document.idx", living.name, other.name]
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_interrupted_prepare_leaves_nothing(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(prepare_module, "CHUNK_DOCUMENTS", 3)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"doc {i}"} for i in range(30)])
    original = IndexedDatasetWriter.add_documents
    calls = []

    def interrupting(self, tokens, lengths):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        original(self, tokens, lengths)

    monkeypatch.setattr(IndexedDatasetWriter, "add_documents", interrupting)
    with pytest.raises(KeyboardInterrupt):
        prepare(source, tmp_path / "out", tokenizer="byte", workers=workers)
    assert names(tmp_path) == ["in.jsonl"]


def test_chunks_in_flight_are_bounded(tmp_path):
    """Reading keeps at most 2 x workers chunks ahead of the writer, whatever the input size."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    options = PrepareOptions(str(source), str(tmp_path / "o"), tokenizer="byte").validate()
    encoder = ChunkEncoder(byte_level(), options, np.dtype(np.uint16))
    read = []

    def endless():
        for i in range(1000):
            read.append(i)
            yield Chunk([i + 1], [0], [b'{"text": "ab"}'], 14)

    encoded = encode_chunks(endless(), encoder, workers=2)
    for _ in range(3):
        assert next(encoded).tokens[0].tolist() == [97, 98]
    encoded.close()
    assert len(read) <= 3 + 2 * 2


# --- a real corpus -----------------------------------------------------------------------------


def test_tinyshakespeare_with_gpt2(tmp_path, gpt2):
    if not SHAKESPEARE.is_file():
        pytest.skip(f"{SHAKESPEARE} not found (reference data beside the project)")
    summary = prepare(SHAKESPEARE, tmp_path / "shakespeare", append_eod=True, workers=2, **gpt2_files())
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", SHAKESPEARE.read_text()) if p.strip()]
    assert summary["documents"] == len(paragraphs) == 7222
    assert 280_000 < summary["tokens"] < 360_000  # ~4.6 characters a GPT-2 token in English
    sequences, dataset = tokens_of(summary["outputs"]["text"])
    assert sequences[0] == gpt2.encode(paragraphs[0].strip("\n")) + [50256]
    assert dataset.num_tokens == summary["tokens"]


@pytest.mark.parametrize("option, expected", [
    ({"tokenizer": "sentencepiece"},
     "--tokenizer 'sentencepiece' is not accepted; give one of gpt2-bpe, huggingface, byte"),
    ({"input_format": "csv"}, "--input-format 'csv' is not accepted; give one of json, text"),
    ({"json_keys": ["text", "text"]}, "--json-keys text text is not accepted; give distinct keys"),
    ({"json_keys": ["a/b"]}, "--json-keys a/b is not accepted; give distinct keys, each usable in a file name"),
    ({"workers": True}, "--workers True is not accepted; give 1 to"),
])
def test_a_bad_option_from_the_api_is_refused_as_a_run_option_is(tmp_path, option, expected):
    """prepare()'s options are checked by hwbench.arguments.Option: the same line as `hwbench run`'s."""
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    with pytest.raises(UsageError) as refused:
        prepare(source, tmp_path / "out", **{"tokenizer": "byte", **option})
    assert str(refused.value).startswith(expected), refused.value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
