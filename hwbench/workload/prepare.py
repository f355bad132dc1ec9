"""``hwbench data prepare``: text to a Megatron ``.bin/.idx`` dataset.

What Megatron's ``tools/preprocess_data.py`` does (without --split-sentences),
with its option names, and the same output: ``{PREFIX}_{key}_document.bin/.idx``
per JSON key, one sequence per document, ``--append-eod`` adding the tokenizer's
end-of-document id to every non-empty document, the token dtype chosen from the
vocabulary size (hwbench.workload.indexed.dtype_for_vocab: int32 for Llama 3's
128256 ids). The tokenizer: GPT-2's BPE from its vocab and merges files, a
Hugging Face tokenizer.json (``--tokenizer-model``, Megatron's
HuggingFaceTokenizer), or bytes.

Input (``--input``, optionally ``.gz``, ``.xz`` or ``.bz2`` compressed):

* JSON lines (``.json``, ``.jsonl``, ``.ndjson``): one JSON object a line, the
  text of each ``--json-keys`` key a document. Blank lines are skipped.
* plain text (``.txt``, ``.text``, or ``--input-format text``), read as UTF-8;
  ``--text-document`` says what a document is:
  ``paragraph`` (default): a block of lines between blank lines, its text the
  lines as they are without the final line break;
  ``line``: each non-blank line, without its line break;
  ``file``: the whole file, verbatim (held in memory: for small files).
  The output key is ``text``.

Memory stays bounded whatever the input size: lines are read lazily, grouped
into chunks of at most CHUNK_DOCUMENTS documents or CHUNK_BYTES bytes, and at
most 2 x workers chunks are in flight. With ``--workers N`` above 1, N worker
processes parse and encode chunks, each on one thread; the results are written
in input order. (A ``multiprocessing.Pool.imap`` would read the whole input
ahead of the workers, and a crashed worker would hang it; a
``ProcessPoolExecutor`` with a bounded queue of futures does neither.) With 1
the work stays in this process, also on one thread, so tokens/s per worker is a
per-core figure either way.

Bad input is one line naming the file and the line (and byte offset): a line
that is not JSON or lacks the key, text that is not UTF-8, an input without a
document. Nothing is left under the final names when preparing fails or is
interrupted.
"""

from __future__ import annotations

import bz2
import concurrent.futures
import dataclasses
import gzip
import io
import json
import lzma
import multiprocessing
import os
import signal
import sys
import time
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import ExitStack, closing
from typing import Literal, TextIO

import numpy as np
from tabulate import tabulate

from hwbench.arguments import Option
from hwbench.device.host import usable_cores
from hwbench.errors import UsageError
from hwbench.lifeline import die_with_parent
from hwbench.workload.in_order import in_order
from hwbench.workload.indexed import IndexedDatasetWriter, dtype_for_vocab
from hwbench.workload.tokenizer import Tokenizer, build_tokenizer, single_threaded

TOKENIZERS = ("gpt2-bpe", "huggingface", "byte")
# Megatron's --tokenizer-type names
TOKENIZER_ALIASES = {"GPT2BPETokenizer": "gpt2-bpe", "HuggingFaceTokenizer": "huggingface"}
INPUT_FORMATS = ("json", "text")
TEXT_DOCUMENTS = ("paragraph", "line", "file")
Opener = Callable[[str, Literal["rb"]], io.BufferedIOBase]
COMPRESSIONS: dict[str, Opener] = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson", ".jsonlines")
TEXT_SUFFIXES = (".txt", ".text")
CHUNK_DOCUMENTS = 256
CHUNK_BYTES = 1 << 18  # small enough to balance workers on small inputs, large enough to amortise IPC
TEXT_KEY = "text"


class InputError(UsageError):
    """Input text that cannot be prepared; names the file and line."""


# Each worker tokenizes flat out, so workers beyond the cores only contend for them; twice the cores
# still takes a hand-set count such as README's 4 on a 2-core laptop, and bounds the processes forked.
WORKERS_PER_CORE = 2


def max_workers() -> int:
    """The most --workers accepted: WORKERS_PER_CORE x the cores this process may use."""
    return WORKERS_PER_CORE * usable_cores()


@dataclasses.dataclass(frozen=True)
class PrepareOptions:
    """One ``hwbench data prepare`` invocation, validated by ``validate``."""

    input_path: str
    output_prefix: str
    tokenizer: str | None = None  # None: huggingface with a tokenizer_model, else gpt2-bpe
    vocab_file: str | None = None
    merge_file: str | None = None
    tokenizer_model: str | None = None  # a Hugging Face tokenizer.json, or its folder
    eod_token: str | None = None  # None: the tokenizer's own end-of-document token
    json_keys: tuple[str, ...] | None = None  # None: ('text',) for JSON input
    input_format: str | None = None  # None: from the file name
    text_document: str | None = None  # None: 'paragraph' for text input
    append_eod: bool = False
    workers: int = 1

    def validate(self) -> PrepareOptions:
        """The options with defaults filled in; UsageError, one line, on a bad value or combination."""
        _check_input(self.input_path)
        input_format = _INPUT_FORMAT.check(self.input_format or _format_from_name(self.input_path))
        self._check_combination(input_format)
        keys = tuple(self.json_keys) if self.json_keys is not None else (TEXT_KEY,)
        tokenizer = self.tokenizer or ("huggingface" if self.tokenizer_model else "gpt2-bpe")
        validated = dataclasses.replace(
            self, input_format=input_format, text_document=_TEXT_DOCUMENT.check(self.text_document or "paragraph"),
            json_keys=_JSON_KEYS.check(keys, shown=" ".join(keys)), tokenizer=_TOKENIZER.check(tokenizer),
            workers=_workers().check(self.workers))
        validated._check_tokenizer_files()
        _check_outputs(validated)
        return validated

    def _check_tokenizer_files(self) -> None:
        """Each tokenizer's files and no other: two tokenizers given at once are refused, not one
        of them silently used."""
        if self.tokenizer != "gpt2-bpe" and (self.vocab_file or self.merge_file):
            instead = "; --tokenizer-model is the whole tokenizer" if self.tokenizer == "huggingface" else ""
            raise UsageError(f"--vocab-file and --merge-file apply to --tokenizer gpt2-bpe only, not "
                             f"{self.tokenizer}{instead}")
        if self.tokenizer != "huggingface" and self.tokenizer_model:
            raise UsageError(f"--tokenizer-model applies to --tokenizer huggingface (a Hugging Face tokenizer.json), "
                             f"not {self.tokenizer}; give one tokenizer")
        if self.tokenizer != "huggingface" and self.eod_token is not None:
            raise UsageError(f"--eod-token applies to --tokenizer huggingface; {self.tokenizer}'s end of a "
                             "document is fixed")

    def _check_combination(self, input_format: str) -> None:
        """An option of the other input format is refused rather than ignored."""
        if input_format == "text" and self.json_keys is not None:
            raise UsageError("--json-keys applies to JSON lines input; plain text is written under the key 'text'")
        if input_format == "json" and self.text_document is not None:
            raise UsageError("--text-document applies to plain-text input, not JSON lines")

    def output_prefixes(self) -> dict[str, str]:
        """Output path prefix per key, as preprocess_data.py names them."""
        return {key: f"{self.output_prefix}_{key}_document" for key in self.json_keys or (TEXT_KEY,)}


# What each option takes, checked as `hwbench run`'s options are (hwbench.options.Option): one line
# naming the option, the value and what is accepted.
_INPUT_FORMAT = Option(help="", name="input_format", choices=INPUT_FORMATS)
_TEXT_DOCUMENT = Option(help="", name="text_document", choices=TEXT_DOCUMENTS)
_TOKENIZER = Option(help="", name="tokenizer", choices=TOKENIZERS)
_JSON_KEYS = Option(help="", name="json_keys", type=tuple, accepts="distinct keys, each usable in a file name",
                    valid=lambda keys: bool(keys) and len(set(keys)) == len(keys)
                    and all(isinstance(k, str) and k and "/" not in k and os.sep not in k for k in keys))


def _workers() -> Option:
    """--workers: at most twice the cores this process may use, which a test or a cgroup may change."""
    most = max_workers()  # --workers 100000 forked that many tokenizers and exhausted a 24 GiB machine
    return Option(help="", name="workers", type=int, valid=lambda workers: 1 <= workers <= most,
                  accepts=f"1 to {most} (twice the {usable_cores()} cores this process may use)")


def _check_input(path: str) -> None:
    if not os.path.isfile(path):
        what = "not a regular file; give a JSON lines or text file" if os.path.exists(path) else "no such file"
        raise UsageError(f"--input {path}: {what}")


def _check_outputs(options: PrepareOptions) -> None:
    """The output files can be written: under a folder, no folder in their place, none of them the input
    (each is replaced at the end)."""
    folder = _nearest_existing(os.path.dirname(os.path.abspath(options.output_prefix)))
    if not os.path.isdir(folder):
        raise UsageError(f"--output-prefix {options.output_prefix}: {folder} is a file, not a folder")
    for prefix in options.output_prefixes().values():
        for output in (f"{prefix}.bin", f"{prefix}.idx"):
            if os.path.exists(output) and not os.path.isfile(output):
                raise UsageError(f"--output-prefix {options.output_prefix}: {output} exists and is not a file; "
                                 "give another prefix")
            if os.path.exists(output) and os.path.samefile(output, options.input_path):
                raise UsageError(f"--output-prefix {options.output_prefix}: {output} is the --input file; give "
                                 "another prefix, or the input would be overwritten")


def _nearest_existing(folder: str) -> str:
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return folder


def _output_folder(output_prefix: str) -> tuple[str, str | None]:
    """Create the output prefix's folder when missing: (the folder, the topmost folder
    created, to remove again if preparing fails, or None)."""
    folder = os.path.dirname(os.path.abspath(output_prefix))
    existing = _nearest_existing(folder)
    if existing == folder:
        return folder, None
    top = folder
    while os.path.dirname(top) != existing:
        top = os.path.dirname(top)
    try:
        os.makedirs(folder)
    except OSError as error:
        raise UsageError(f"--output-prefix {output_prefix}: cannot create {folder} ({error.strerror})") from None
    return folder, top


def _remove_empty_folders(folder: str, top: str) -> None:
    """Undo _output_folder's creation when nothing was written into it."""
    while True:
        try:
            os.rmdir(folder)
        except OSError:
            return
        if folder == top:
            return
        folder = os.path.dirname(folder)


def _format_from_name(path: str) -> str:
    """json or text from the suffix under any compression suffix."""
    stem, suffix = os.path.splitext(path)
    if suffix.lower() in COMPRESSIONS:
        suffix = os.path.splitext(stem)[1]
    if suffix.lower() in JSON_SUFFIXES:
        return "json"
    if suffix.lower() in TEXT_SUFFIXES:
        return "text"
    raise UsageError(f"--input {path}: cannot tell JSON lines from plain text by the name "
                     f"({', '.join(JSON_SUFFIXES + TEXT_SUFFIXES)}); add --input-format json or text")


# --- reading: documents and chunks ---------------------------------------------------


@dataclasses.dataclass
class Chunk:
    """Raw documents of the input, with where each starts (for error messages)."""

    lines: list[int] = dataclasses.field(default_factory=list)  # 1-based line of each document's start
    offsets: list[int] = dataclasses.field(default_factory=list)  # byte offset (of the decompressed input)
    texts: list[bytes] = dataclasses.field(default_factory=list)
    size: int = 0


def open_input(path: str) -> io.BufferedIOBase:
    """The input as a binary stream, decompressed by its suffix."""
    opener = COMPRESSIONS.get(os.path.splitext(path)[1].lower(), open)
    try:
        return opener(path, "rb")
    except OSError as error:
        raise UsageError(f"--input {path}: cannot open ({error.strerror or error})") from None


def read_documents(stream: io.BufferedIOBase, input_format: str,
                   text_document: str) -> Iterator[tuple[int, int, bytes]]:
    """(line, byte offset, raw text) of each document, read lazily."""
    if input_format == "text" and text_document == "file":
        data = stream.read()
        if not data.isspace() and data:
            yield 1, 0, data
    elif input_format == "text" and text_document == "paragraph":
        yield from _paragraphs(stream)
    else:
        offset = 0
        for number, line in enumerate(stream, start=1):
            if not line.isspace():  # a blank line is no document (and not JSON)
                yield number, offset, _without_line_break(line)
            offset += len(line)


def _paragraphs(stream: io.BufferedIOBase) -> Iterator[tuple[int, int, bytes]]:
    """Blocks of non-blank lines, without the final line break."""
    block: list[bytes] = []
    block_line = block_offset = offset = 0
    for number, line in enumerate(stream, start=1):
        if not line.isspace():
            if not block:
                block_line, block_offset = number, offset
            block.append(line)
        elif block:
            yield block_line, block_offset, _without_line_break(b"".join(block))
            block = []
        offset += len(line)
    if block:
        yield block_line, block_offset, _without_line_break(b"".join(block))


def _without_line_break(text: bytes) -> bytes:
    if text.endswith(b"\n"):
        text = text[:-2] if text.endswith(b"\r\n") else text[:-1]
    return text


def chunked(documents: Iterator[tuple[int, int, bytes]], input_path: str) -> Iterator[Chunk]:
    """Group documents into chunks of bounded count and size; a corrupt
    compressed input is reported as bad input."""
    chunk = Chunk()
    line = 0
    try:
        for line, offset, text in documents:
            chunk.lines.append(line)
            chunk.offsets.append(offset)
            chunk.texts.append(text)
            chunk.size += len(text)
            if len(chunk.texts) >= CHUNK_DOCUMENTS or chunk.size >= CHUNK_BYTES:
                yield chunk
                chunk = Chunk()
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as error:
        raise InputError(f"{input_path}: cannot read past line {line} ({error})") from None
    if chunk.texts:
        yield chunk


# --- encoding: one chunk at a time, in this process or in workers ------------------------------


@dataclasses.dataclass
class EncodedChunk:
    documents: int
    tokens: list[np.ndarray]  # per key: ids back to back
    lengths: list[np.ndarray]  # per key: ids per document (eod included)


class ChunkEncoder:
    """Parses and tokenizes chunks; picklable, so each worker gets one."""

    def __init__(self, tokenizer: Tokenizer, options: PrepareOptions, dtype: np.dtype) -> None:
        self.tokenizer, self.dtype = tokenizer, dtype
        assert options.input_format is not None and options.json_keys is not None, "validate() fills these in"
        self.input_path, self.input_format = options.input_path, options.input_format
        self.keys = options.json_keys
        # the id every document ends with, or None (prepare() refuses --append-eod without one)
        self.eod_id = tokenizer.eod_id if options.append_eod else None

    def __call__(self, chunk: Chunk) -> EncodedChunk:
        texts_per_key = self._texts(chunk)
        tokens, lengths = [], []
        for texts in texts_per_key:
            try:
                ids, counts = self.tokenizer.encode_batch_arrays(texts, self.dtype)
            except (TypeError, ValueError):  # e.g. a lone surrogate from a JSON escape
                self._find_unencodable(chunk, texts)
                raise
            if self.eod_id is not None:
                ids, counts = _append_eod(ids, counts, self.eod_id)
            tokens.append(ids)
            lengths.append(counts)
        return EncodedChunk(len(chunk.texts), tokens, lengths)

    def _where(self, chunk: Chunk, i: int) -> str:
        return f"{self.input_path}: line {chunk.lines[i]}"

    def _texts(self, chunk: Chunk) -> list[list[str]]:
        per_key: list[list[str]] = [[] for _ in self.keys]
        for i, raw in enumerate(chunk.texts):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                line = chunk.lines[i] + raw.count(b"\n", 0, error.start)
                raise InputError(f"{self.input_path}: line {line} (byte offset {chunk.offsets[i] + error.start}): "
                                 f"invalid UTF-8 {raw[error.start:error.start + 4]!r}; the input must be UTF-8 text") \
                    from None
            if self.input_format == "text":
                per_key[0].append(text)
                continue
            record = self._parse_json(chunk, i, text)
            for texts, key in zip(per_key, self.keys):
                texts.append(self._field(chunk, i, record, key))
        return per_key

    def _parse_json(self, chunk: Chunk, i: int, text: str) -> dict:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{self._where(chunk, i)}: not JSON ({error.msg} at column {error.colno})") from None
        except RecursionError:
            raise InputError(f"{self._where(chunk, i)}: JSON nested too deeply to read; give one object a line "
                             "with the text under a key") from None
        except ValueError as error:  # Python's limit on the digits of an integer (int_max_str_digits)
            raise InputError(f"{self._where(chunk, i)}: a JSON number too long to read "
                             f"({str(error).split(';')[0]})") from None
        if not isinstance(record, dict):
            raise InputError(f"{self._where(chunk, i)}: expected a JSON object, found {_json_kind(record)}")
        return record

    def _field(self, chunk: Chunk, i: int, record: dict, key: str) -> str:
        if key not in record:
            found = ", ".join(map(repr, list(record)[:8])) or "none"
            raise InputError(f"{self._where(chunk, i)}: no key {key!r} (keys: {found}); choose them with --json-keys")
        value = record[key]
        if not isinstance(value, str):
            raise InputError(f"{self._where(chunk, i)}: key {key!r} holds {_json_kind(value)}, not a string")
        return value

    def _find_unencodable(self, chunk: Chunk, texts: list[str]) -> None:
        for i, text in enumerate(texts):
            try:
                self.tokenizer.encode(text)
            except (TypeError, ValueError) as error:
                raise InputError(f"{self._where(chunk, i)}: text the tokenizer cannot encode ({error}); lone "
                                 "surrogate escapes such as \\ud800 are not valid Unicode") from None


def _json_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__)


def _append_eod(ids: np.ndarray, counts: np.ndarray, eod: int) -> tuple[np.ndarray, np.ndarray]:
    """The end-of-document id after every non-empty document (as Megatron)."""
    ends = np.cumsum(counts)[counts > 0]
    return np.insert(ids, ends, eod), counts + (counts > 0)


_worker_encoder: ChunkEncoder | None = None


def _worker_start(encoder: ChunkEncoder, parent_pid: int) -> None:
    global _worker_encoder
    die_with_parent(parent_pid)  # a parent killed outright (SIGKILL) leaves no worker running on
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the parent handles these (a terminal signals the whole group) and stops us
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: workers are the parallelism
    _worker_encoder = encoder


def _worker_encode(chunk: Chunk) -> EncodedChunk:
    assert _worker_encoder is not None
    return _worker_encoder(chunk)


def encode_chunks(chunks: Iterator[Chunk], encoder: ChunkEncoder,
                  workers: int) -> Generator[EncodedChunk, None, None]:
    """Encoded chunks in input order, at most 2 x workers in flight (so at
    most that many chunks are read ahead of the writer)."""
    # One tokenizers thread in this process too; set before the workers fork, so
    # they inherit it and tokenizers' fork check stays quiet.
    with single_threaded():
        if workers == 1:
            for chunk in chunks:
                yield encoder(chunk)
            return
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=_worker_context(),
                                                      initializer=_worker_start, initargs=(encoder, os.getpid()))
        try:
            yield from in_order(pool, _worker_encode, chunks, 2 * workers)
        except concurrent.futures.process.BrokenProcessPool:
            raise UsageError(f"--workers {workers}: a worker process died (out of memory?); nothing was written") \
                from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _worker_context() -> multiprocessing.context.BaseContext:
    """fork on Linux: workers start at once and need no importable __main__
    (spawn re-runs the caller's script: ``python - <script`` fails and an
    unguarded script recurses). Forking is safe here: the workers run only
    tokenizers with its parallelism off, so no thread pool the parent may hold
    is needed in them. Elsewhere spawn, the safe default."""
    if sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


# --- progress and the whole run ---------------------------------------------------------------


class PrepareProgress:
    """Documents, tokens and tokens/s on stderr: one rewritten line on a
    terminal, a line every ``log_interval_s`` otherwise."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True, log_interval_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.interactive = enabled and self.stream.isatty()
        self.interval = 0.2 if self.interactive else log_interval_s
        self.started = time.monotonic()
        self._last = self.started
        self._drawn = False

    def update(self, documents: int, tokens: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last < self.interval:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        text = f"prepare: {documents:,} documents  {tokens:,} tokens  {tokens / elapsed:,.0f} tokens/s"
        if self.interactive:
            print("\r" + text.ljust(79), end="\n" if final else "", file=self.stream, flush=True)
            self._drawn = not final
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._drawn:
            print(file=self.stream, flush=True)
            self._drawn = False


def prepare(input_path: str | os.PathLike, output_prefix: str | os.PathLike, *, tokenizer: str | None = None,
            vocab_file: str | os.PathLike | None = None, merge_file: str | os.PathLike | None = None,
            tokenizer_model: str | os.PathLike | None = None, eod_token: str | None = None,
            json_keys: Sequence[str] | None = None, input_format: str | None = None,
            text_document: str | None = None, append_eod: bool = False, workers: int = 1,
            progress: bool = False, progress_stream: TextIO | None = None) -> dict:
    """Tokenize ``input_path`` into ``{output_prefix}_{key}_document.bin/.idx``
    and return a summary: documents, tokens, seconds, tokens_per_second,
    tokens_per_second_per_worker, workers, tokenizer, vocab_size, eod_id, dtype,
    outputs (key -> path prefix), files. ``tokenizer`` None: 'huggingface' when
    ``tokenizer_model`` is given, else 'gpt2-bpe'. UsageError (one line) on bad
    input or options; on any failure or interruption no output is left under the
    final names."""
    options = PrepareOptions(
        input_path=os.fspath(input_path), output_prefix=os.fspath(output_prefix), tokenizer=tokenizer,
        vocab_file=None if vocab_file is None else os.fspath(vocab_file),
        merge_file=None if merge_file is None else os.fspath(merge_file),
        tokenizer_model=None if tokenizer_model is None else os.fspath(tokenizer_model), eod_token=eod_token,
        json_keys=None if json_keys is None else tuple(json_keys), input_format=input_format,
        text_document=text_document, append_eod=append_eod, workers=workers,
    ).validate()
    loading = time.perf_counter()
    assert options.tokenizer is not None, "validate() fills it in"
    encoder_tokenizer = build_tokenizer(options.tokenizer, options.vocab_file, options.merge_file,
                                        options.tokenizer_model, options.eod_token)
    load_seconds = time.perf_counter() - loading
    if options.append_eod and encoder_tokenizer.eod_id is None:
        raise UsageError(f"--append-eod: --tokenizer-model {options.tokenizer_model} does not say which token ends a "
                         "document (no eos_token in a tokenizer_config.json beside it); name it with --eod-token, "
                         "as --eod-token '<|end_of_text|>' for Llama 3")
    dtype = dtype_for_vocab(encoder_tokenizer.vocab_size)
    prefixes = options.output_prefixes()
    meter = PrepareProgress(progress_stream, enabled=progress)
    started = time.perf_counter()
    folder, created = _output_folder(options.output_prefix)
    try:
        documents, tokens = _write_datasets(options, encoder_tokenizer, dtype, prefixes, meter)
    except BaseException:
        if created:
            _remove_empty_folders(folder, created)
        raise
    seconds = time.perf_counter() - started
    files = [prefix + suffix for prefix in prefixes.values() for suffix in (".bin", ".idx")]
    return {
        "input": options.input_path, "documents": documents, "tokens": tokens, "seconds": seconds,
        "tokens_per_second": tokens / seconds, "tokens_per_second_per_worker": tokens / seconds / options.workers,
        "workers": options.workers, "tokenizer": encoder_tokenizer.name, "vocab_size": encoder_tokenizer.vocab_size,
        "eod_id": encoder_tokenizer.eod_id, "append_eod": options.append_eod, "dtype": str(dtype),
        "tokenizer_load_seconds": load_seconds, "outputs": prefixes, "files": files,
    }


def _write_datasets(options: PrepareOptions, tokenizer: Tokenizer, dtype: np.dtype, prefixes: dict[str, str],
                    meter: PrepareProgress) -> tuple[int, int]:
    """Read, encode and write every key's dataset: (documents, tokens)."""
    assert options.json_keys and options.input_format and options.text_document, "validate() fills these in"
    documents = tokens = 0
    with ExitStack() as stack:
        stream = stack.enter_context(open_input(options.input_path))
        writers = [stack.enter_context(IndexedDatasetWriter(prefixes[key], dtype)) for key in options.json_keys]
        stack.callback(meter.close)
        chunks = chunked(read_documents(stream, options.input_format, options.text_document),
                         options.input_path)
        encoder = ChunkEncoder(tokenizer, options, dtype)
        encoded_chunks = stack.enter_context(closing(encode_chunks(chunks, encoder, options.workers)))
        for encoded in encoded_chunks:
            for writer, ids, counts in zip(writers, encoded.tokens, encoded.lengths):
                writer.add_documents(ids, counts)
                tokens += ids.size
            documents += encoded.documents
            meter.update(documents, tokens)
        if documents == 0:
            raise InputError(f"{options.input_path}: no documents (the input is empty or holds only blank lines)")
        meter.update(documents, tokens, final=True)
        # leaving the block finalizes every writer (or, on an exception, aborts them all)
    return documents, tokens


def summary_table(summary: dict) -> str:
    """The summary of ``prepare`` as a two-column table."""
    rows = [
        ["documents", f"{summary['documents']:,}"],
        ["tokens", f"{summary['tokens']:,}"],
        ["seconds", f"{summary['seconds']:.2f}"],
        ["tokens/s", f"{summary['tokens_per_second']:,.0f}"],
        ["tokens/s per worker", f"{summary['tokens_per_second_per_worker']:,.0f} "
                                f"({summary['workers']} worker{'s' if summary['workers'] > 1 else ''})"],
        ["tokenizer", f"{summary['tokenizer']} (vocab {summary['vocab_size']:,}, "
                      f"eod {'not named' if summary['eod_id'] is None else summary['eod_id']}"
                      f"{', appended' if summary['append_eod'] else ''})"],
        ["dtype", summary["dtype"]],
    ]
    rows += [["output", path] for path in summary["files"]]
    rows += [["train on it", f"hwbench run --data {prefix}"] for prefix in summary["outputs"].values()]
    return tabulate(rows, tablefmt="plain", disable_numparse=True)
