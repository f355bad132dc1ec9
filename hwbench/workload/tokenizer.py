"""Tokenizers that turn text into the token ids of a Megatron dataset.

* ``gpt2_bpe(vocab_file, merge_file)``: GPT-2's byte-level BPE from the
  published ``gpt2-vocab.json`` and ``gpt2-merges.txt`` (the files Megatron's
  ``--tokenizer-type GPT2BPETokenizer`` reads), run by HF ``tokenizers``. Ids
  are GPT-2's: no prefix space, nothing added, and ``<|endoftext|>`` inside the
  text is ordinary text, as in Megatron. The files are checked first, because
  ``tokenizers`` panics on a merges file that does not match its vocabulary.
* ``huggingface(path, eod_token)``: any tokenizer a Hugging Face
  ``tokenizer.json`` describes (Llama 3's, say), what Megatron's
  ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model PATH`` loads through
  transformers' ``AutoTokenizer``. Ids are that tokenizer's with its special
  tokens, as Megatron's ``tokenizer(text).input_ids``: the file's
  post-processor adds them (Llama 3's prepends ``<|begin_of_text|>`` to every
  document), and a special token written in the text is that token. The end of
  a document is Megatron's ``eos_token``: from ``tokenizer_config.json`` (or
  ``special_tokens_map.json``) beside the file, else named by ``eod_token``.
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
HF_TOKENIZER_FILE = "tokenizer.json"
# Where transformers' AutoTokenizer finds the special tokens of a tokenizer.json, in the order it reads them.
HF_SPECIAL_TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")
BYTE_VOCAB_SIZE = 257
_PARALLELISM_VARIABLE = "TOKENIZERS_PARALLELISM"


class TokenizerError(UsageError):
    """Tokenizer files that cannot be used; the message names the file and line."""


class Tokenizer:
    """Text to token ids. ``name``, ``vocab_size`` (ids are 0..vocab_size-1)
    and ``eod_id`` (the end-of-document id ``--append-eod`` adds; None when the
    tokenizer does not say which token it is)."""

    name: str
    vocab_size: int
    eod_id: int | None

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
    worker processes receive it whole. ``add_special_tokens``: run the
    tokenizer's post-processor (a tokenizer.json's BOS, say), as transformers
    does by default."""

    def __init__(self, name: str, hf_tokenizer, eod_id: int | None, vocab_size: int,
                 add_special_tokens: bool = False) -> None:
        self.name, self.eod_id, self.vocab_size = name, eod_id, vocab_size
        self.hf, self.add_special_tokens = hf_tokenizer, add_special_tokens

    def _encode_many(self, texts: list[str]):
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we never use: ~5% faster
        fast = getattr(self.hf, "encode_batch_fast", None)
        return (fast or self.hf.encode_batch)(texts, add_special_tokens=self.add_special_tokens)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=self.add_special_tokens).ids

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


def huggingface(path: str | os.PathLike, eod_token: str | None = None) -> HFTokenizer:
    """The tokenizer of a Hugging Face ``tokenizer.json`` (``path``: the file, or
    the folder holding it, as a model's files come). Llama 3's: vocab 128256,
    eod 128001 (``<|end_of_text|>``, its ``eos_token``), each document starting
    with 128000 (``<|begin_of_text|>``). The end-of-document token is
    ``eod_token`` when given, else the ``eos_token`` of a tokenizer_config.json
    (or special_tokens_map.json) beside the file, else None. Bad files raise
    TokenizerError naming --tokenizer-model, the file and what is wrong."""
    tokenizers = _import_tokenizers()
    file = _tokenizer_file(path)
    hf = _hf_tokenizer(tokenizers, file, _read_text(file))
    vocab = hf.get_vocab(with_added_tokens=True)
    # transformers' len(tokenizer), which Megatron takes, or beyond it when the ids have gaps
    vocab_size = max(hf.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
    return HFTokenizer("huggingface", hf, eod_id=_eod_id(hf, file, eod_token), vocab_size=vocab_size,
                       add_special_tokens=True)


def _tokenizer_file(path: str | os.PathLike) -> str:
    """The tokenizer.json ``path`` names: itself, or the one in the folder it names."""
    file = os.path.join(path, HF_TOKENIZER_FILE) if os.path.isdir(path) else os.fspath(path)
    if not os.path.isfile(file):
        what = f"the folder holds no {HF_TOKENIZER_FILE}" if os.path.isdir(path) else "no such file"
        raise TokenizerError(f"--tokenizer-model {path}: {what}; give a Hugging Face {HF_TOKENIZER_FILE} "
                             "or the folder holding one")
    return file


def _hf_tokenizer(tokenizers, file: str, text: str):
    """The ``tokenizers.Tokenizer`` of a tokenizer.json's text; TokenizerError (one line) for
    anything else: JSON is checked here first, so the line of a syntax error is named."""
    def refuse(problem: str) -> TokenizerError:
        return TokenizerError(f"--tokenizer-model {file}: {problem}; give a Hugging Face {HF_TOKENIZER_FILE}")

    try:
        description = json.loads(text)
    except json.JSONDecodeError as error:
        raise refuse(f"line {error.lineno}: not JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(description, dict) or "model" not in description:
        raise refuse("a JSON file without a tokenizer 'model'")
    try:
        return tokenizers.Tokenizer.from_str(text)
    except Exception as error:  # tokenizers raises a bare Exception with serde's message
        raise refuse(f"not a tokenizer tokenizers can load ({str(error).splitlines()[0][:160]})") from None


def _eod_id(hf, file: str, eod_token: str | None) -> int | None:
    """The id of ``eod_token``, else of the eos_token beside ``file``, else None."""
    if eod_token is None:
        eod_token, source = _eos_token_beside(file)
    else:
        source = "--eod-token"
    if eod_token is None:
        return None
    eod_id = hf.token_to_id(eod_token)
    if eod_id is None:
        raise TokenizerError(f"{source}: {eod_token!r} is not a token of {file}; name the end-of-document token "
                             "with --eod-token")
    return eod_id


def _eos_token_beside(file: str) -> tuple[str | None, str]:
    """The eos_token of the files transformers reads beside a tokenizer.json: (token or None, its file)."""
    folder = os.path.dirname(os.path.abspath(file))
    for name in HF_SPECIAL_TOKEN_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            settings = json.loads(_read_text(path))
        except json.JSONDecodeError as error:
            raise TokenizerError(f"{path}: line {error.lineno}: not JSON ({error.msg}, column {error.colno})") \
                from None
        token = settings.get("eos_token") if isinstance(settings, dict) else None
        token = token.get("content") if isinstance(token, dict) else token  # an AddedToken as a dict
        if isinstance(token, str) and token:
            return token, path
    return None, ""


def build_tokenizer(kind: str, vocab_file: str | None = None, merge_file: str | None = None,
                    tokenizer_model: str | None = None, eod_token: str | None = None) -> Tokenizer:
    """``kind`` 'gpt2-bpe' (needs both files), 'huggingface' (needs ``tokenizer_model``;
    ``eod_token`` optional) or 'byte'."""
    if kind == "byte":
        return byte_level()
    if kind == "gpt2-bpe":
        if not vocab_file or not merge_file:
            raise UsageError("--tokenizer gpt2-bpe needs --vocab-file and --merge-file "
                             "(GPT-2's gpt2-vocab.json and gpt2-merges.txt)")
        return gpt2_bpe(vocab_file, merge_file)
    if kind == "huggingface":
        if not tokenizer_model:
            raise UsageError(f"--tokenizer huggingface needs --tokenizer-model (a {HF_TOKENIZER_FILE} or the "
                             "folder holding one)")
        return huggingface(tokenizer_model, eod_token)
    raise UsageError(f"--tokenizer {kind!r} is not known; choose gpt2-bpe, huggingface or byte")


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
        raise SetupError("the GPT-2 and Hugging Face tokenizers need HF tokenizers (pip install tokenizers)") \
            from None
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
