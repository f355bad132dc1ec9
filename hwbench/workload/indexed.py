"""Megatron's mmap indexed dataset: ``PREFIX.bin`` (tokens) and ``PREFIX.idx`` (index).

The format (Megatron-LM ``megatron/core/datasets/indexed_dataset.py``):

``.idx``, little-endian::

    offset  size  field
    0       9     magic b"MMIDIDX\\x00\\x00"
    9       8     version <Q, always 1
    17      1     dtype code <B (DTYPE_CODES)
    18      8     sequence count S <Q
    26      8     document count D <Q (documents + 1)
    34      4*S   sequence lengths, int32, in tokens
    ...     8*S   sequence pointers, int64: byte offset of each sequence in .bin
                  (the cumulative length x item size)
    ...     8*D   document indices, int64: 0, then the sequence count at each
                  document's end

``.bin``: the token arrays back to back, no header.

``IndexedDataset`` opens a pair with numpy memmaps, so opening costs the same
for a megabyte and a terabyte of tokens, and checks everything the index
promises before anything reads it: a bad file is one line naming the file and
the offset or field (``IndexedDatasetError``), never a wrong sample. It also
reads the older Megatron-DeepSpeed files, whose code 7 meant float64.

``IndexedDatasetWriter`` writes a pair the way ``tools/preprocess_data.py``
(without ``--split-sentences``) does: one sequence per non-empty document.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from hwbench.errors import UsageError
from hwbench.files import umask
from hwbench.temporaries import remove_stale_temporaries as stale_temporaries
from hwbench.temporaries import writer_temporary

MAGIC = b"MMIDIDX\x00\x00"
LEGACY_MAGIC = b"TNTIDX\x00\x00"  # Megatron's older, non-mmap "lazy"/"cached" format
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count
HEADER_SIZE = HEADER.size  # 34

DTYPE_CODES: dict[int, type] = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16,
}
CODE_FOR_DTYPE = {np.dtype(t): code for code, t in DTYPE_CODES.items()}

VARIANT_MEGATRON_LM = "megatron-lm"
VARIANT_DEEPSPEED_LEGACY = "megatron-deepspeed-legacy"  # codes 6 and 7 both float64 (np.float, np.double)

_CHECK_CHUNK = 1 << 20  # sequences validated at a time: bounded temporaries for any index size


class IndexedDatasetError(UsageError):
    """A ``.bin/.idx`` pair that is not a valid Megatron mmap dataset; the
    message is one line naming the file and the offset or field at fault."""


def dtype_for_vocab(vocab_size: int | None) -> np.dtype:
    """The token dtype Megatron picks: uint16 when the vocabulary has fewer
    than 65500 ids, else int32."""
    return np.dtype(np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32)


def _little_endian(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("<")


class IndexedDataset:
    """A Megatron mmap dataset opened read-only; every array is a view into a
    memmap, so nothing is read into memory until it is used.

    ``dataset.get(i)`` is sequence i's tokens; ``len(dataset)`` is the number of
    sequences (documents, for data written without --split-sentences).
    """

    def __init__(self, path_prefix: str | os.PathLike) -> None:
        self.path_prefix = str(path_prefix)
        self.idx_path = self.path_prefix + ".idx"
        self.bin_path = self.path_prefix + ".bin"
        idx_size = self._file_size(self.idx_path)
        bin_size = self._file_size(self.bin_path)
        with open(self.idx_path, "rb") as stream:
            header = stream.read(HEADER_SIZE)
        code, sequence_count, document_count = self._check_header(header, idx_size)
        index = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        lengths_at = HEADER_SIZE
        pointers_at = lengths_at + 4 * sequence_count
        documents_at = pointers_at + 8 * sequence_count
        self.sequence_lengths = np.frombuffer(index, dtype="<i4", count=sequence_count, offset=lengths_at)
        self.sequence_pointers = np.frombuffer(index, dtype="<i8", count=sequence_count, offset=pointers_at)
        self.document_indices = np.frombuffer(index, dtype="<i8", count=document_count, offset=documents_at)
        self._check_document_indices(documents_at)
        self.dtype_code = code
        self.dtype, self.variant = self._token_dtype(code, bin_size)
        self._check_sequences(lengths_at, pointers_at, bin_size)
        self.num_tokens = int(self.sequence_lengths.sum(dtype=np.int64))
        # mmap refuses an empty file; a dataset of empty documents has no tokens to map.
        self._tokens = (np.memmap(self.bin_path, dtype=self.dtype, mode="r") if bin_size
                        else np.empty(0, dtype=self.dtype))

    # --- what readers use -------------------------------------------------

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``offset`` to ``offset + length`` (default: to the end) of
        sequence ``index``, as a read-only view into the ``.bin`` memmap."""
        count = len(self)
        if not -count <= index < count:
            raise IndexError(f"{self.path_prefix}: sequence {index} of {count}")
        index %= count
        size = int(self.sequence_lengths[index])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"{self.path_prefix}: tokens {offset}..{offset + length} of sequence {index}, "
                             f"which has {size}")
        start = int(self.sequence_pointers[index]) // self.dtype.itemsize + offset
        return self._tokens[start:start + length]

    # --- validation -------------------------------------------------------

    def _file_size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            hint = ""
            if self.path_prefix.endswith((".bin", ".idx")):
                hint = " (give the path prefix, without .bin/.idx)"
            raise IndexedDatasetError(f"{path}: no such file{hint}") from None
        except OSError as error:
            raise IndexedDatasetError(f"{path}: cannot read ({error.strerror})") from None

    def _fail(self, path: str, message: str) -> IndexedDatasetError:
        return IndexedDatasetError(f"{path}: {message}")

    def _check_header(self, header: bytes, idx_size: int) -> tuple[int, int, int]:
        path = self.idx_path
        if header.startswith(LEGACY_MAGIC):
            raise self._fail(path, f"legacy Megatron indexed format (magic {LEGACY_MAGIC!r}) is not supported; "
                                   "re-run preprocess_data.py with the mmap implementation (the default)")
        if header[:len(MAGIC)] != MAGIC:
            raise self._fail(path, f"bad magic {header[:len(MAGIC)]!r} at offset 0; expected {MAGIC!r} "
                                   "(Megatron mmap format)")
        if len(header) < HEADER_SIZE:
            raise self._fail(path, f"truncated: {idx_size} bytes, shorter than the {HEADER_SIZE}-byte header")
        _, version, code, sequence_count, document_count = HEADER.unpack(header)
        if version != VERSION:
            raise self._fail(path, f"version {version} at offset 9; only version {VERSION} is known")
        if code not in DTYPE_CODES:
            raise self._fail(path, f"unknown dtype code {code} at offset 17; known codes are "
                                   + ", ".join(f"{c} {np.dtype(t)}" for c, t in DTYPE_CODES.items()))
        expected = HEADER_SIZE + 12 * sequence_count + 8 * document_count
        if idx_size != expected:
            state = "truncated" if idx_size < expected else "longer than its header says"
            raise self._fail(path, f"{state}: {idx_size} bytes; {sequence_count} sequences and {document_count} "
                                   f"document indices need {expected}")
        return code, sequence_count, document_count

    def _check_document_indices(self, documents_at: int) -> None:
        documents, count = self.document_indices, len(self.sequence_lengths)

        def at(i: int) -> str:
            return f"document_indices[{i}] (offset {documents_at + 8 * i})"

        if len(documents) == 0:
            raise self._fail(self.idx_path, "document count 0 at offset 26; it is at least 1 (the leading 0)")
        if documents[0] != 0:
            raise self._fail(self.idx_path, f"{at(0)} is {documents[0]}; it must be 0")
        for start in range(0, len(documents) - 1, _CHECK_CHUNK):
            block = documents[start:start + _CHECK_CHUNK + 1]
            falls = np.flatnonzero(np.diff(block) < 0)
            if falls.size:
                i = start + int(falls[0]) + 1
                raise self._fail(self.idx_path, f"{at(i)} is {documents[i]}, less than the {documents[i - 1]} "
                                                "before it; document indices never decrease")
        if documents[-1] != count:
            i = len(documents) - 1
            raise self._fail(self.idx_path, f"{at(i)} is {documents[i]}; the last document index must be the "
                                            f"sequence count {count}")

    def _token_dtype(self, code: int, bin_size: int) -> tuple[np.dtype, str]:
        dtype = _little_endian(np.dtype(DTYPE_CODES[code]))
        if code == 7:  # float32 in Megatron-LM, float64 (np.double) in older Megatron-DeepSpeed
            tokens = int(self.sequence_lengths.sum(dtype=np.int64))
            if tokens and bin_size == 8 * tokens:
                return _little_endian(np.dtype(np.float64)), VARIANT_DEEPSPEED_LEGACY
        return dtype, VARIANT_MEGATRON_LM

    def _check_sequences(self, lengths_at: int, pointers_at: int, bin_size: int) -> None:
        lengths, pointers, itemsize = self.sequence_lengths, self.sequence_pointers, self.dtype.itemsize
        expected_start = 0
        for start in range(0, len(lengths), _CHECK_CHUNK):
            block = lengths[start:start + _CHECK_CHUNK].astype(np.int64)
            negative = np.flatnonzero(block < 0)
            if negative.size:
                i = start + int(negative[0])
                raise self._fail(self.idx_path, f"sequence_lengths[{i}] (offset {lengths_at + 4 * i}) is "
                                                f"{lengths[i]}; lengths are never negative")
            starts = pointers[start:start + len(block)]
            past = np.flatnonzero((starts < 0) | (starts + block * itemsize > bin_size))
            if past.size:
                i = start + int(past[0])
                at, end = int(pointers[i]), int(pointers[i]) + int(lengths[i]) * itemsize  # Python ints: no overflow
                if at < 0:
                    raise self._fail(self.idx_path, f"sequence_pointers[{i}] (offset {pointers_at + 8 * i}) is {at}; "
                                                    "a byte offset is never negative")
                raise self._fail(self.bin_path, f"sequence {i} ({int(lengths[i])} tokens at byte {at}) ends at "
                                                f"byte {end}, past the end of the file ({bin_size} bytes)")
            ends = expected_start + np.cumsum(block * itemsize)
            expected = np.concatenate(([expected_start], ends[:-1]))
            wrong = np.flatnonzero(starts != expected)
            if wrong.size:
                i = start + int(wrong[0])
                raise self._fail(self.idx_path, f"sequence_pointers[{i}] (offset {pointers_at + 8 * i}) is "
                                                f"{pointers[i]}; the lengths before it put sequence {i} at byte "
                                                f"{expected[wrong[0]]}")
            expected_start = int(ends[-1])
        if bin_size != expected_start:
            raise self._fail(self.bin_path, f"{bin_size} bytes, but {self.idx_path} describes {expected_start} "
                                            f"({expected_start // itemsize} tokens of {self.dtype}); "
                                            "the pair does not belong together")


def remove_stale_temporaries(folder: str, name: str) -> list[str]:
    """Remove the temporaries of an earlier writer of the same prefix that was killed
    outright (SIGKILL, a power cut: no cleanup ran): ``NAME.bin.HOST-PID-XXXX.tmp`` and
    ``NAME.idx.HOST-PID-XXXX.tmp`` whose process is gone, and those of writers that did not
    name their process (hwbench.temporaries). A living writer's files are left alone.
    Returns what was removed."""
    return [entry for kind in (".bin.", ".idx.") for entry in stale_temporaries(folder, name + kind)]


class IndexedDatasetWriter:
    """Writes a Megatron mmap dataset as it goes: tokens stream to a temporary
    ``.bin``; only the lengths are kept in memory (4 bytes a sequence, plus 8 a
    document) until ``finalize`` writes the ``.idx``.

    Nothing appears under the final names before ``finalize``. It then removes
    any existing ``PREFIX.idx``, renames the new ``.bin`` into place and renames
    the new ``.idx`` last: the ``.idx`` is the commit, so a crash between the
    steps leaves a ``.bin`` without an ``.idx`` (which readers refuse as
    missing), never an index describing the wrong tokens. ``abort`` removes the
    temporaries. As a context manager it finalizes on a clean exit and aborts on
    any exception, KeyboardInterrupt included.

    A document's tokens become one sequence; an empty document adds a document
    boundary and no sequence, as Megatron's builder does.
    """

    def __init__(self, path_prefix: str | os.PathLike, dtype) -> None:
        self.path_prefix = str(path_prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_FOR_DTYPE:
            known = ", ".join(str(np.dtype(t)) for t in DTYPE_CODES.values())
            raise IndexedDatasetError(f"{self.path_prefix}: dtype {self.dtype} has no Megatron code; "
                                      f"use one of {known}")
        self._disk_dtype = _little_endian(self.dtype)
        self._limits = _token_limits(self.dtype)
        self._lengths = array("i")  # int32, as in the .idx
        self._document_ends = array("q")  # sequence count at each document's end
        self.num_tokens = 0
        self._state = "open"
        folder, name = os.path.split(os.path.abspath(self.path_prefix))
        remove_stale_temporaries(folder, name)
        self._bin_temporary = self._temporary(folder, f"{name}.bin.")
        try:
            self._idx_temporary = self._temporary(folder, f"{name}.idx.")
        except BaseException:
            os.remove(self._bin_temporary)
            raise
        self._bin = open(self._bin_temporary, "wb")

    @staticmethod
    def _temporary(folder: str, prefix: str) -> str:
        """An empty file beside the output, readable as the user's umask allows
        (mkstemp makes 0600; datasets are shared files)."""
        try:
            path = writer_temporary(folder, prefix)
        except FileNotFoundError:
            raise IndexedDatasetError(f"{folder}: no such folder for the output") from None
        except OSError as error:
            raise IndexedDatasetError(f"{folder}: cannot write there ({error.strerror})") from None
        os.chmod(path, 0o666 & ~umask())
        return path

    @property
    def num_documents(self) -> int:
        return len(self._document_ends)

    def add_document(self, tokens: Iterable[int] | np.ndarray) -> None:
        """Append one document (a sequence of token ids) as one sequence."""
        array_ = tokens if isinstance(tokens, np.ndarray) else np.asarray(list(tokens))
        self.add_documents(array_.reshape(-1), np.array([array_.size], dtype=np.int64))

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append several documents at once: ``tokens`` is their ids back to
        back, ``lengths`` the number of ids of each (zeros for empty ones)."""
        self._require_open()
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != tokens.size or (lengths.size and lengths.min() < 0):
            raise ValueError(f"{len(lengths)} document lengths summing to {int(lengths.sum())} "
                             f"for {tokens.size} tokens")
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            raise IndexedDatasetError(f"{self.path_prefix}: a document of {int(lengths.max())} tokens is longer "
                                      "than the format's int32 sequence length allows")
        self._check_range(tokens, lengths)
        self._bin.write(np.ascontiguousarray(tokens, dtype=self._disk_dtype).data.cast("B"))
        present = lengths[lengths > 0]
        ends = len(self._lengths) + np.cumsum(lengths > 0)
        self._lengths.frombytes(present.astype("=i4").tobytes())
        self._document_ends.frombytes(ends.astype("=i8").tobytes())
        self.num_tokens += tokens.size

    def finalize(self) -> None:
        """Write the ``.idx`` and move both files onto their final names."""
        self._require_open()
        try:
            self._bin.flush()
            os.fsync(self._bin.fileno())
            self._bin.close()
            with open(self._idx_temporary, "wb") as index:
                self._write_index(index)
                index.flush()
                os.fsync(index.fileno())
            final_bin, final_idx = self.path_prefix + ".bin", self.path_prefix + ".idx"
            if os.path.lexists(final_idx):
                os.remove(final_idx)  # no old index may describe the new .bin
            os.replace(self._bin_temporary, final_bin)
            os.replace(self._idx_temporary, final_idx)
        except BaseException:
            self.abort()
            raise
        self._state = "finalized"

    def abort(self) -> None:
        """Drop everything written; the final names are left as they were."""
        if self._state == "aborted":
            return
        self._bin.close()
        for path in (self._bin_temporary, self._idx_temporary):
            Path(path).unlink(missing_ok=True)
        self._state = "aborted"

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            self.abort()
        elif self._state == "open":
            self.finalize()

    # --- internals ----------------------------------------------------------

    def _require_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"{self.path_prefix}: writer already {self._state}")

    def _check_range(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        if tokens.size == 0:
            return
        if tokens.dtype.kind not in "iub" and not (tokens.dtype.kind == "f" and self.dtype.kind == "f"):
            raise IndexedDatasetError(f"{self.path_prefix}: token ids must be integers, not {tokens.dtype}")
        low, high = self._limits
        bad = np.flatnonzero((tokens < low) | (tokens > high))
        if bad.size:
            position = int(bad[0])
            document = self.num_documents + int(np.searchsorted(np.cumsum(lengths), position, side="right"))
            raise IndexedDatasetError(f"{self.path_prefix}: token id {tokens[position]} in document {document} "
                                      f"does not fit {self.dtype} ({low}..{high})")

    def _write_index(self, stream) -> None:
        sequence_count, document_count = len(self._lengths), len(self._document_ends) + 1
        stream.write(HEADER.pack(MAGIC, VERSION, CODE_FOR_DTYPE[self.dtype], sequence_count, document_count))
        lengths = np.frombuffer(self._lengths, dtype=np.int32) if sequence_count else np.empty(0, np.int32)
        stream.write(lengths.astype("<i4").tobytes())
        pointer = 0
        for start in range(0, sequence_count, _CHECK_CHUNK):  # pointers in bounded pieces
            block = lengths[start:start + _CHECK_CHUNK].astype(np.int64) * self.dtype.itemsize
            ends = pointer + np.cumsum(block)
            stream.write(np.concatenate(([pointer], ends[:-1])).astype("<i8").tobytes())
            pointer = int(ends[-1])
        stream.write(np.zeros(1, "<i8").tobytes())
        if self._document_ends:
            stream.write(np.frombuffer(self._document_ends, dtype=np.int64).astype("<i8").tobytes())


def _token_limits(dtype: np.dtype) -> tuple[int, int]:
    """The ids a dtype holds exactly: its integer range, or the integers a
    float represents without rounding."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    exact = 2 ** (np.finfo(dtype).nmant + 1)
    return -exact, exact


def write_indexed_dataset(path_prefix: str | os.PathLike, documents: Iterable[Iterable[int]], dtype) -> Path:
    """Write ``documents`` (token id sequences) as ``PREFIX.bin/.idx``; returns the ``.idx`` path."""
    with IndexedDatasetWriter(path_prefix, dtype) as writer:
        for document in documents:
            writer.add_document(document)
    return Path(str(path_prefix) + ".idx")
