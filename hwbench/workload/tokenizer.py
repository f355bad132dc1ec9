"""Tokenizers that turn text into the token ids of a Megatron dataset.

* ``gpt2_bpe(vocab_file, merge_file)``: GPT-2's byte-level BPE from the
  published ``gpt2-vocab.json`` and ``gpt2-merges.txt`` (the files Megatron's
  ``--tokenizer-type GPT2BPETokenizer`` reads), run by HF ``tokenizers``. Ids
  are GPT-2's: no prefix space, nothing added, and ``<|endoftext|>`` inside the
  text is ordinary text, as in Megatron. The files are checked first, because
  ``tokenizers`` panics on a merges file that does not match its vocabulary.
* ``byte_level()``: needs no files; ids 0-255 are the UTF-8 bytes, 256 is the
  end of a document.

Both encode batches on one thread of the calling process when asked through
``single_threaded()``: hwbench parallelises with worker processes, so that the
figures it reports per worker are per core.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator, Sequence

import numpy as np

from hwbench.errors import SetupError, UsageError

GPT2_EOD = "<|endoftext|>"
BYTE_VOCAB_SIZE = 257
_PARALLELISM_VARIABLE = "TOKENIZERS_PARALLELISM"


class TokenizerError(UsageError):
    """Tokenizer files that cannot be used; the message names the file and line."""


class Tokenizer:
    """Text to token ids. ``name``, ``vocab_size`` (ids are 0..vocab_size-1)
    and ``eod_id`` (the end-of-document id ``--append-eod`` adds)."""

    name: str
    vocab_size: int
    eod_id: int

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_batch_arrays(self, texts: Sequence[str], dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all ``texts`` back to back as one ``dtype`` array, and
        each text's number of ids (int64): what a dataset writer takes."""
        ids = self.encode_batch(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum()))
        return tokens, lengths

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255; 256 ends a document."""

    name = "byte"
    vocab_size = BYTE_VOCAB_SIZE
    eod_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def encode_batch_arrays(self, texts: Sequence[str], dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
        encoded = [text.encode("utf-8") for text in texts]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        return np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(dtype), lengths

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A HF ``tokenizers.Tokenizer`` with hwbench's interface; picklable, so
    worker processes receive it whole."""

    def __init__(self, name: str, hf_tokenizer, eod_id: int, vocab_size: int) -> None:
        self.name, self.eod_id, self.vocab_size = name, eod_id, vocab_size
        self.hf = hf_tokenizer

    def _encode_many(self, texts: list[str]):
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we never use: ~5% faster
        fast = getattr(self.hf, "encode_batch_fast", None)
        return (fast or self.hf.encode_batch)(texts, add_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        texts = texts if isinstance(texts, list) else list(texts)
        return [encoding.ids for encoding in self._encode_many(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False)


def byte_level() -> ByteTokenizer:
    """The byte tokenizer (vocab 257, eod 256); needs no files."""
    return ByteTokenizer()


def gpt2_bpe(vocab_file: str | os.PathLike, merge_file: str | os.PathLike) -> HFTokenizer:
    """GPT-2's byte-level BPE: 'Hello world' -> [15496, 995], eod 50256, vocab
    50257 with the published files. Bad files raise TokenizerError naming the
    file and line."""
    tokenizers = _import_tokenizers()
    vocab = read_vocab(vocab_file)
    merges = read_merges(merge_file, vocab, vocab_file)
    if GPT2_EOD not in vocab:
        raise TokenizerError(f"{vocab_file}: no {GPT2_EOD} token; not a GPT-2 vocabulary")
    model = tokenizers.models.BPE(vocab=vocab, merges=merges)
    hf = tokenizers.Tokenizer(model)
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = tokenizers.decoders.ByteLevel()
    return HFTokenizer("gpt2-bpe", hf, eod_id=vocab[GPT2_EOD], vocab_size=len(vocab))


def read_vocab(path: str | os.PathLike) -> dict[str, int]:
    """A BPE vocabulary: a JSON object of token -> id, the ids being 0..N-1."""
    text = _read_text(path)
    try:
        vocab = json.loads(text)
    except json.JSONDecodeError as error:
        raise TokenizerError(f"{path}: line {error.lineno}: not JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{path}: line 1: expected a JSON object of token -> id, found {type(vocab).__name__}")
    for token, token_id in vocab.items():
        if type(token_id) is not int or token_id < 0:
            raise TokenizerError(f"{path}: line {_line_of(text, json.dumps(token))}: token {token!r} has id "
                                 f"{token_id!r}; ids are non-negative integers")
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        missing = next(i for i, token_id in enumerate(ids) if token_id != i)
        raise TokenizerError(f"{path}: the ids are not 0..{len(ids) - 1}: id {missing} is missing or repeated")
    return vocab


def read_merges(path: str | os.PathLike, vocab: dict[str, int], vocab_path: str | os.PathLike) -> list[tuple[str, str]]:
    """GPT-2 merges: a '#version' line, then 'left right' per line, each part
    and their concatenation being tokens of ``vocab``."""
    lines = _read_text(path).split("\n")
    if not lines[0].startswith("#version"):
        raise TokenizerError(f"{path}: line 1: expected the '#version: 0.2' header of a GPT-2 merges file, "
                             f"found {lines[0][:40]!r}")
    merges = []
    for number, line in enumerate(lines[1:], start=2):
        line = line.rstrip("\r")
        if not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"{path}: line {number}: expected two tokens separated by one space, "
                                 f"found {line[:60]!r}")
        for piece in (parts[0], parts[1], parts[0] + parts[1]):
            if piece not in vocab:
                raise TokenizerError(f"{path}: line {number}: merge {line!r} needs {piece!r}, which is not in "
                                     f"{vocab_path}; the vocabulary and merges do not match")
        merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer(kind: str, vocab_file: str | None = None, merge_file: str | None = None) -> Tokenizer:
    """``kind`` 'gpt2-bpe' (needs both files) or 'byte'."""
    if kind == "byte":
        return byte_level()
    if kind == "gpt2-bpe":
        if not vocab_file or not merge_file:
            raise UsageError("--tokenizer gpt2-bpe needs --vocab-file and --merge-file "
                             "(GPT-2's gpt2-vocab.json and gpt2-merges.txt)")
        return gpt2_bpe(vocab_file, merge_file)
    raise UsageError(f"--tokenizer {kind!r} is not known; choose gpt2-bpe or byte")


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """HF ``tokenizers`` batches on one thread inside this block (it reads
    TOKENIZERS_PARALLELISM at each call); the variable is restored after."""
    previous = os.environ.get(_PARALLELISM_VARIABLE)
    os.environ[_PARALLELISM_VARIABLE] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(_PARALLELISM_VARIABLE, None)
        else:
            os.environ[_PARALLELISM_VARIABLE] = previous


def _import_tokenizers():
    try:
        import tokenizers
        import tokenizers.decoders
        import tokenizers.models
        import tokenizers.pre_tokenizers
    except ImportError:
        raise SetupError("the GPT-2 tokenizer needs HF tokenizers (pip install tokenizers)") from None
    return tokenizers


def _read_text(path: str | os.PathLike) -> str:
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except FileNotFoundError:
        raise TokenizerError(f"{path}: no such file") from None
    except OSError as error:
        raise TokenizerError(f"{path}: cannot read ({error.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise TokenizerError(f"{path}: line {line}: invalid UTF-8 at byte offset {error.start}") from None


def _line_of(text: str, needle: str) -> int:
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else 1
