"""Megatron's mmap .bin/.idx format (Megatron-LM indexed_dataset.py): reading, writing, refusing bad files."""

import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from hwbench.errors import UsageError
from hwbench.workload.indexed import (
    DTYPE_CODES,
    IndexedDataset,
    IndexedDatasetError,
    IndexedDatasetWriter,
    dtype_for_vocab,
    write_indexed_dataset,
)

DOCUMENTS = [[5, 6, 7], [1], [], [9, 8, 7, 6, 5], [65535, 0]]


def spec_files(prefix, documents, code, token_dtype=None, *, magic=b"MMIDIDX\x00\x00", version=1):
    """A .idx/.bin pair written from the documented format alone, byte by byte, one
    sequence per non-empty document (as Megatron's builder)."""
    token_dtype = np.dtype(token_dtype or DTYPE_CODES[code]).newbyteorder("<")
    lengths = [len(d) for d in documents if d]
    pointers = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64) * token_dtype.itemsize
    document_indices = [0]
    for document in documents:
        document_indices.append(document_indices[-1] + (1 if document else 0))
    header = magic + struct.pack("<Q", version) + struct.pack("<B", code)
    header += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(document_indices))
    with open(f"{prefix}.idx", "wb") as stream:
        stream.write(header)
        stream.write(struct.pack(f"<{len(lengths)}i", *lengths))
        stream.write(struct.pack(f"<{len(lengths)}q", *pointers[:len(lengths)]))
        stream.write(struct.pack(f"<{len(document_indices)}q", *document_indices))
    with open(f"{prefix}.bin", "wb") as stream:
        for document in documents:
            stream.write(np.asarray(document, dtype=token_dtype).tobytes())
    return header


def read_all(dataset):
    return [dataset.get(i).tolist() for i in range(len(dataset))]


def test_dtype_for_vocab_follows_megatron():
    assert dtype_for_vocab(50257) == np.uint16
    assert dtype_for_vocab(65499) == np.uint16
    assert dtype_for_vocab(65500) == np.int32
    assert dtype_for_vocab(None) == np.int32
    assert DTYPE_CODES == {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
                           7: np.float32, 8: np.uint16}


def test_round_trip_and_index_bytes_are_exactly_the_specification(tmp_path):
    prefix = tmp_path / "corpus_text_document"
    previous = os.umask(0o022)
    try:
        write_indexed_dataset(prefix, DOCUMENTS, np.uint16)
    finally:
        os.umask(previous)
    for suffix in (".bin", ".idx"):  # shared data: readable by others, as the umask allows
        assert (tmp_path / f"corpus_text_document{suffix}").stat().st_mode & 0o777 == 0o644
    dataset = IndexedDataset(prefix)
    assert read_all(dataset) == [d for d in DOCUMENTS if d]
    assert dataset.dtype == np.uint16 and dataset.variant == "megatron-lm"
    assert (len(dataset), dataset.num_documents, dataset.num_tokens) == (4, 5, 11)
    assert dataset.path_prefix == str(prefix)

    raw = (tmp_path / "corpus_text_document.idx").read_bytes()
    expected = (b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([8]) + (4).to_bytes(8, "little")
                + (6).to_bytes(8, "little"))
    assert raw[:34] == expected
    lengths = [3, 1, 5, 2]
    pointers = [0, 6, 8, 18]  # cumulative length x 2 bytes
    document_indices = [0, 1, 2, 2, 3, 4]  # the empty document adds a boundary, no sequence
    body = b"".join(n.to_bytes(4, "little", signed=True) for n in lengths)
    body += b"".join(n.to_bytes(8, "little", signed=True) for n in pointers + document_indices)
    assert raw[34:] == body
    assert (tmp_path / "corpus_text_document.bin").read_bytes() == np.array(
        [t for d in DOCUMENTS for t in d], dtype="<u2").tobytes()


def test_a_pair_written_from_the_specification_opens(tmp_path):
    prefix = str(tmp_path / "spec")
    spec_files(prefix, DOCUMENTS, code=8)
    dataset = IndexedDataset(prefix)
    assert read_all(dataset) == [d for d in DOCUMENTS if d]
    assert dataset.document_indices.tolist() == [0, 1, 2, 2, 3, 4]
    assert dataset.sequence_pointers.tolist() == [0, 6, 8, 18]
    assert dataset.sequence_lengths.tolist() == [3, 1, 5, 2]


def test_get_returns_a_read_only_view_with_offset_and_length(tmp_path):
    prefix = str(tmp_path / "view")
    write_indexed_dataset(prefix, DOCUMENTS, np.int32)
    dataset = IndexedDataset(prefix)
    assert dataset.get(2, 1).tolist() == [8, 7, 6, 5]
    assert dataset.get(2, 1, 2).tolist() == [8, 7]
    assert dataset.get(-1).tolist() == [65535, 0]
    part = dataset.get(2)
    assert isinstance(part.base, np.memmap) or isinstance(part, np.memmap)
    with pytest.raises(ValueError):
        part[0] = 1
    with pytest.raises(IndexError):
        dataset.get(2, 3, 5)
    with pytest.raises(IndexError):
        dataset.get(4)


@pytest.mark.parametrize("code", sorted(DTYPE_CODES))
def test_every_dtype_code_reads_and_writes(tmp_path, code):
    dtype = np.dtype(DTYPE_CODES[code])
    documents = [[1, 2, 3], [100, 0], [7]]
    spec_files(str(tmp_path / "spec"), documents, code)
    dataset = IndexedDataset(tmp_path / "spec")
    assert dataset.dtype == dtype and dataset.dtype_code == code
    assert read_all(dataset) == documents

    write_indexed_dataset(tmp_path / "written", documents, dtype)
    assert (tmp_path / "written.idx").read_bytes() == (tmp_path / "spec.idx").read_bytes()
    assert (tmp_path / "written.bin").read_bytes() == (tmp_path / "spec.bin").read_bytes()


def test_old_megatron_deepspeed_float64_variant_of_code_7(tmp_path):
    documents = [[1, 2, 3], [50256, 4]]
    spec_files(str(tmp_path / "legacy"), documents, code=7, token_dtype=np.float64)
    legacy = IndexedDataset(tmp_path / "legacy")
    assert legacy.variant == "megatron-deepspeed-legacy" and legacy.dtype == np.float64
    assert read_all(legacy) == documents
    spec_files(str(tmp_path / "current"), documents, code=7)
    current = IndexedDataset(tmp_path / "current")
    assert current.variant == "megatron-lm" and current.dtype == np.float32
    assert read_all(current) == documents


def test_empty_documents_and_an_empty_dataset(tmp_path):
    write_indexed_dataset(tmp_path / "empty", [[], []], np.uint16)
    dataset = IndexedDataset(tmp_path / "empty")
    assert (len(dataset), dataset.num_documents, dataset.num_tokens) == (0, 2, 0)


# --- bad files -------------------------------------------------------------------------------


def _good_pair(tmp_path):
    prefix = str(tmp_path / "bad_text_document")
    spec_files(prefix, [[1, 2, 3], [4, 5], [6]], code=8)
    return prefix


def _patch(path, offset, data):
    with open(path, "r+b") as stream:
        stream.seek(offset)
        stream.write(data)


def _refused(prefix, *fragments):
    with pytest.raises(IndexedDatasetError) as caught:
        IndexedDataset(prefix)
    message = str(caught.value)
    assert isinstance(caught.value, UsageError)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_bad_magic(tmp_path):
    prefix = _good_pair(tmp_path)
    _patch(prefix + ".idx", 0, b"XXX")
    _refused(prefix, prefix + ".idx", "bad magic b'XXXDIDX\\x00\\x00' at offset 0", "expected b'MMIDIDX\\x00\\x00'")


def test_legacy_tntidx_has_its_own_message(tmp_path):
    prefix = _good_pair(tmp_path)
    _patch(prefix + ".idx", 0, b"TNTIDX\x00\x00")
    _refused(prefix, prefix + ".idx", "legacy", "TNTIDX")


def test_bad_version(tmp_path):
    prefix = _good_pair(tmp_path)
    _patch(prefix + ".idx", 9, struct.pack("<Q", 2))
    _refused(prefix, prefix + ".idx", "version 2 at offset 9")


def test_unknown_dtype_code(tmp_path):
    prefix = _good_pair(tmp_path)
    _patch(prefix + ".idx", 17, bytes([9]))
    _refused(prefix, prefix + ".idx", "unknown dtype code 9 at offset 17")


def test_truncated_index_names_expected_and_actual_sizes(tmp_path):
    prefix = _good_pair(tmp_path)
    index = Path(prefix + ".idx")
    data = index.read_bytes()
    index.write_bytes(data[:-5])
    expected = 34 + 3 * 12 + 4 * 8
    _refused(prefix, prefix + ".idx", "truncated", f"{expected - 5} bytes", f"need {expected}")
    index.write_bytes(data[:20])
    _refused(prefix, prefix + ".idx", "truncated", "20 bytes")


def test_pointer_past_the_end_of_the_bin(tmp_path):
    prefix = _good_pair(tmp_path)
    _patch(prefix + ".idx", 34 + 3 * 4 + 2 * 8, struct.pack("<q", 1000))  # sequence 2's pointer
    _refused(prefix, prefix + ".bin", "sequence 2", "byte 1000", "past the end", "12 bytes")


def test_bin_shorter_than_the_index_says(tmp_path):
    prefix = _good_pair(tmp_path)
    os.truncate(prefix + ".bin", 10)
    _refused(prefix, prefix + ".bin", "sequence 2", "ends at byte 12", "10 bytes")


def test_bin_of_another_dataset_is_refused(tmp_path):
    prefix = _good_pair(tmp_path)
    with open(prefix + ".bin", "ab") as stream:
        stream.write(b"\x00" * 4)
    _refused(prefix, prefix + ".bin", "16 bytes", "describes 12")


def test_pointer_inconsistent_with_lengths(tmp_path):
    prefix = _good_pair(tmp_path)
    _patch(prefix + ".idx", 34 + 3 * 4 + 1 * 8, struct.pack("<q", 4))
    _refused(prefix, prefix + ".idx", "sequence_pointers[1]", "is 4", "byte 6")


@pytest.mark.parametrize("indices,fragment", [
    ([1, 1, 2, 3], "document_indices[0]"),
    ([0, 2, 1, 3], "document_indices[2] (offset"),
    ([0, 1, 2, 2], "sequence count 3"),
])
def test_document_indices_inconsistent(tmp_path, indices, fragment):
    prefix = _good_pair(tmp_path)
    _patch(prefix + ".idx", 34 + 3 * 12, struct.pack("<4q", *indices))
    _refused(prefix, prefix + ".idx", fragment)


def test_missing_files_are_named(tmp_path):
    prefix = _good_pair(tmp_path)
    os.remove(prefix + ".bin")
    _refused(prefix, prefix + ".bin", "no such file")
    _refused(prefix + ".idx", "without .bin/.idx")


# --- the writer ----------------------------------------------------------------------------


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_abort_and_exceptions_leave_nothing(tmp_path):
    writer = IndexedDatasetWriter(tmp_path / "aborted", np.uint16)
    writer.add_document([1, 2, 3])
    assert len(_names(tmp_path)) == 2  # the two temporaries
    writer.abort()
    assert _names(tmp_path) == []
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with IndexedDatasetWriter(tmp_path / "failed", np.uint16) as failing:
                failing.add_document([1])
                raise error
        assert _names(tmp_path) == []


def test_a_failed_rewrite_keeps_the_previous_pair(tmp_path):
    write_indexed_dataset(tmp_path / "kept", [[1, 2]], np.uint16)
    before = {name: (tmp_path / name).read_bytes() for name in _names(tmp_path)}
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(tmp_path / "kept", np.uint16) as writer:
            writer.add_document([3, 4, 5])
            raise RuntimeError("interrupted")
    assert {name: (tmp_path / name).read_bytes() for name in _names(tmp_path)} == before


@pytest.mark.parametrize("dtype,bad", [(np.uint16, 70000), (np.uint16, -1), (np.int8, 128), (np.uint8, 256)])
def test_writer_refuses_ids_that_do_not_fit(tmp_path, dtype, bad):
    with IndexedDatasetWriter(tmp_path / "range", dtype) as writer:
        writer.add_document([1, 2])
        with pytest.raises(IndexedDatasetError, match=rf"range: token id {bad} in document 1 does not fit"):
            writer.add_document([3, bad])
    assert IndexedDataset(tmp_path / "range").num_tokens == 2  # the refused document was not written


def test_writer_refuses_a_dtype_without_a_code(tmp_path):
    with pytest.raises(IndexedDatasetError, match="float16 has no Megatron code"):
        IndexedDatasetWriter(tmp_path / "f16", np.float16)
    assert _names(tmp_path) == []


def test_batched_documents_match_one_by_one(tmp_path):
    write_indexed_dataset(tmp_path / "single", DOCUMENTS, np.uint16)
    with IndexedDatasetWriter(tmp_path / "batched", np.uint16) as writer:
        flat = np.array([t for d in DOCUMENTS for t in d], dtype=np.uint16)
        writer.add_documents(flat[:4], np.array([3, 1, 0]))
        writer.add_documents(flat[4:], np.array([5, 2]))
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"batched{suffix}").read_bytes() == (tmp_path / f"single{suffix}").read_bytes()


def test_opening_a_huge_dataset_reads_no_tokens(tmp_path):
    """16 GiB of (sparse) tokens open as fast as a small file: only the index is read."""
    prefix = str(tmp_path / "huge")
    count, length = 8, 2 ** 30
    lengths = np.full(count, length, dtype="<i4")
    pointers = (np.arange(count, dtype="<i8") * length * 2).astype("<i8")
    with open(prefix + ".idx", "wb") as stream:
        stream.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, count, count + 1))
        stream.write(lengths.tobytes() + pointers.tobytes() + np.arange(count + 1, dtype="<i8").tobytes())
    try:
        with open(prefix + ".bin", "wb") as stream:
            stream.truncate(count * length * 2)
    except OSError as error:
        pytest.skip(f"this filesystem cannot hold a sparse 16 GiB file: {error}")
    started = time.perf_counter()
    dataset = IndexedDataset(prefix)
    assert time.perf_counter() - started < 1.0
    assert dataset.num_tokens == count * length
    assert dataset.get(count - 1, length - 3).tolist() == [0, 0, 0]
