"""The streaming AEAD format: round trips, every class of tampering, bounded memory."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest

from cantata.security.keys import JobKey, JobKeys, KeyUnwrapError, UnknownKeyVersionError
from cantata.security.stream_aead import (
    TAG_SIZE,
    ContextMismatchError,
    FormatDowngradeError,
    HeaderAuthenticationError,
    MalformedHeaderError,
    SegmentAuthenticationError,
    SegmentLimitError,
    StreamContext,
    StreamDecryptor,
    StreamEncryptor,
    StreamHeader,
    TrailingDataError,
    TruncatedStreamError,
    UnsupportedFormatError,
    rewrap_header,
    segment_nonce,
)

SEGMENT = 1024
CONTEXT = StreamContext("acme", "job-1", 100, "model")


def job_keys(job_id: str = "job-1", versions: tuple[int, ...] = (1,)) -> JobKeys:
    return JobKeys("acme", job_id, {v: JobKey("acme", job_id, v, os.urandom(32)) for v in versions})


KEYS = job_keys()


def seal(plaintext: bytes, *, context: StreamContext = CONTEXT, keys: JobKeys = KEYS, write_size: int = 300) -> bytes:
    sink = io.BytesIO()
    encryptor = StreamEncryptor(sink, context=context, wrapper=keys.current, segment_size=SEGMENT)
    for offset in range(0, len(plaintext), write_size):
        encryptor.write(plaintext[offset : offset + write_size])
    summary = encryptor.close()
    assert summary.plaintext_size == len(plaintext)
    return sink.getvalue()


def unseal(sealed: bytes, *, context: StreamContext = CONTEXT, keys: JobKeys = KEYS) -> bytes:
    return StreamDecryptor(io.BytesIO(sealed), context=context, unwrapper=keys).read_all()


def header_length(sealed: bytes) -> int:
    source = io.BytesIO(sealed)
    StreamHeader.read(source)
    return source.tell()


def segment_span(sealed: bytes, index: int) -> slice:
    start = header_length(sealed) + index * (SEGMENT + TAG_SIZE)
    return slice(start, start + SEGMENT + TAG_SIZE)


def flip_bit(data: bytes, position: int) -> bytes:
    changed = bytearray(data)
    changed[position] ^= 0x01
    return bytes(changed)


PLAINTEXT = os.urandom(3 * SEGMENT + 100)


@pytest.mark.parametrize("size", [0, 1, SEGMENT - 1, SEGMENT, SEGMENT + 1, 3 * SEGMENT, 3 * SEGMENT + 100])
def test_round_trip_at_segment_boundaries(size: int) -> None:
    plaintext = os.urandom(size)
    sealed = seal(plaintext)
    assert size < 64 or plaintext[:64] not in sealed
    assert unseal(sealed) == plaintext


def test_summary_matches_what_the_reader_verifies() -> None:
    sink = io.BytesIO()
    encryptor = StreamEncryptor(sink, context=CONTEXT, wrapper=KEYS.current, segment_size=SEGMENT)
    encryptor.write(PLAINTEXT)
    written = encryptor.close()
    decryptor = StreamDecryptor(io.BytesIO(sink.getvalue()), context=CONTEXT, unwrapper=KEYS)
    decryptor.read_all()
    assert decryptor.summary == written
    assert written.segments == 4


class _Views:
    """A source that hands out memoryviews, as the dataset loader's does."""

    def __init__(self, data: bytes) -> None:
        self._view, self._offset = memoryview(data), 0

    def read(self, size: int) -> memoryview:
        part = self._view[self._offset : self._offset + size]
        self._offset += len(part)
        return part


@pytest.mark.parametrize("size", [0, 1, SEGMENT, 3 * SEGMENT, 3 * SEGMENT + 100])
def test_read_into_a_buffer_gives_the_plaintext_and_summary_of_iteration(size: int) -> None:
    plaintext = os.urandom(size)
    sealed = seal(plaintext)
    iterated = StreamDecryptor(io.BytesIO(sealed), context=CONTEXT, unwrapper=KEYS)
    assert b"".join(iterated) == plaintext
    into = StreamDecryptor(_Views(sealed), context=CONTEXT, unwrapper=KEYS)
    buffer = bytearray(len(sealed))
    assert into.read_into(buffer) == size
    assert buffer[:size] == plaintext
    assert into.summary == iterated.summary


@pytest.mark.parametrize(
    "tamper, error",
    [
        (lambda s: s[: segment_span(s, 1).start], TruncatedStreamError),
        (lambda s: s[: segment_span(s, 1).start + 500], SegmentAuthenticationError),
        (lambda s: s[: header_length(s)], TruncatedStreamError),
        (lambda s: flip_bit(s, segment_span(s, 1).start + 5), SegmentAuthenticationError),
        (lambda s: s + s[segment_span(s, 0)], TrailingDataError),
    ],
)
def test_read_into_refuses_what_iteration_refuses(tamper, error) -> None:
    sealed = tamper(seal(os.urandom(2 * SEGMENT)))
    with pytest.raises(error):
        unseal(sealed)
    with pytest.raises(error):
        StreamDecryptor(_Views(sealed), context=CONTEXT, unwrapper=KEYS).read_into(bytearray(len(sealed)))


def test_read_into_refuses_a_buffer_smaller_than_the_plaintext() -> None:
    decryptor = StreamDecryptor(io.BytesIO(seal(PLAINTEXT)), context=CONTEXT, unwrapper=KEYS)
    with pytest.raises(ValueError, match="does not fit a buffer of 3000 bytes"):
        decryptor.read_into(bytearray(3000))


def test_every_object_gets_a_fresh_data_key_salt_and_nonce_prefix() -> None:
    first, second = (StreamHeader.read(io.BytesIO(seal(PLAINTEXT))) for _ in range(2))
    assert first.key_envelope != second.key_envelope
    assert first.salt != second.salt
    assert first.nonce_prefix != second.nonce_prefix
    assert first.commitment != second.commitment


def test_nonce_is_prefix_counter_and_last_flag() -> None:
    prefix = bytes(range(7))
    assert segment_nonce(prefix, 5, last=False) == prefix + b"\x00\x00\x00\x05\x00"
    assert segment_nonce(prefix, 0xFFFFFFFF, last=True) == prefix + b"\xff\xff\xff\xff\x01"


def test_segment_counter_refuses_to_wrap() -> None:
    with pytest.raises(SegmentLimitError):
        segment_nonce(bytes(7), 1 << 32, last=False)


def test_truncation_at_a_segment_boundary() -> None:
    sealed = seal(PLAINTEXT)
    with pytest.raises(TruncatedStreamError):
        unseal(sealed[: segment_span(sealed, 2).stop])


def test_truncation_inside_a_segment() -> None:
    sealed = seal(PLAINTEXT)
    cut = sealed[: segment_span(sealed, 1).start + 500]
    with pytest.raises(SegmentAuthenticationError):
        unseal(cut)
    complete = StreamDecryptor(io.BytesIO(sealed), context=CONTEXT, unwrapper=KEYS)
    complete.read_all()
    expected = complete.summary.sealed_size
    decryptor = StreamDecryptor(io.BytesIO(cut), context=CONTEXT, unwrapper=KEYS, expected_sealed_size=expected)
    with pytest.raises(TruncatedStreamError):
        decryptor.read_all()


def test_truncation_inside_the_header_and_of_all_segments() -> None:
    sealed = seal(PLAINTEXT)
    with pytest.raises(TruncatedStreamError):
        unseal(sealed[:40])
    with pytest.raises(TruncatedStreamError):
        unseal(sealed[: header_length(sealed)])


def test_data_after_the_final_segment() -> None:
    sealed = seal(os.urandom(2 * SEGMENT))
    with pytest.raises(TrailingDataError):
        unseal(sealed + sealed[segment_span(sealed, 0)])


def test_reordered_segments() -> None:
    sealed = seal(PLAINTEXT)
    first, second = segment_span(sealed, 0), segment_span(sealed, 1)
    swapped = sealed[: first.start] + sealed[second] + sealed[first] + sealed[second.stop :]
    with pytest.raises(SegmentAuthenticationError):
        unseal(swapped)


def test_segment_from_another_stream_with_the_same_key() -> None:
    sealed, other = seal(PLAINTEXT), seal(PLAINTEXT)
    span = segment_span(sealed, 1)
    with pytest.raises(SegmentAuthenticationError):
        unseal(sealed[: span.start] + other[span] + sealed[span.stop :])


@pytest.mark.parametrize("offset_in_segment", [10, SEGMENT + TAG_SIZE - 3], ids=["body", "tag"])
def test_one_flipped_bit_in_a_segment(offset_in_segment: int) -> None:
    sealed = seal(PLAINTEXT)
    with pytest.raises(SegmentAuthenticationError):
        unseal(flip_bit(sealed, segment_span(sealed, 1).start + offset_in_segment))


@pytest.mark.parametrize(
    ("field", "error"),
    [
        ("salt", HeaderAuthenticationError),
        ("nonce_prefix", HeaderAuthenticationError),
        ("commitment", HeaderAuthenticationError),
    ],
)
def test_one_flipped_bit_in_a_header_field(field: str, error: type[Exception]) -> None:
    sealed = seal(PLAINTEXT)
    header = StreamHeader.read(io.BytesIO(sealed))
    value = getattr(header, field)
    position = sealed.index(value)
    with pytest.raises(error):
        unseal(flip_bit(sealed, position + len(value) // 2))


def test_flipped_bit_in_the_segment_size_is_refused() -> None:
    sealed = seal(PLAINTEXT)
    header = StreamHeader.read(io.BytesIO(sealed))
    size_at = sealed.index(header.salt) - 4
    with pytest.raises(HeaderAuthenticationError):
        unseal(flip_bit(sealed, size_at + 2))


def test_flipped_bit_in_the_key_envelope_is_refused() -> None:
    sealed = seal(PLAINTEXT)
    envelope = StreamHeader.read(io.BytesIO(sealed)).key_envelope
    with pytest.raises(KeyUnwrapError):
        unseal(flip_bit(sealed, sealed.index(envelope) + 20))


def test_bad_magic() -> None:
    with pytest.raises(MalformedHeaderError):
        unseal(flip_bit(seal(PLAINTEXT), 0))


def test_downgraded_version_is_refused_before_the_key_is_used() -> None:
    sealed = bytearray(seal(PLAINTEXT))
    sealed[4] = 0

    class MustNotUnwrap:
        def unwrap(self, envelope: bytes) -> bytes:
            raise AssertionError("the key was used before the version was checked")

    with pytest.raises(FormatDowngradeError):
        StreamDecryptor(io.BytesIO(bytes(sealed)), context=CONTEXT, unwrapper=MustNotUnwrap())


@pytest.mark.parametrize("offset", [4, 5], ids=["future-version", "unknown-algorithm"])
def test_unknown_version_or_algorithm(offset: int) -> None:
    sealed = bytearray(seal(PLAINTEXT))
    sealed[offset] = 7
    with pytest.raises(UnsupportedFormatError):
        unseal(bytes(sealed))


@pytest.mark.parametrize(
    "expected",
    [
        StreamContext("other", "job-1", 100, "model"),
        StreamContext("acme", "job-2", 100, "model"),
        StreamContext("acme", "job-1", 200, "model"),
        StreamContext("acme", "job-1", 100, "optimizer"),
    ],
    ids=["tenant", "job", "step", "object"],
)
def test_object_read_in_another_context(expected: StreamContext) -> None:
    with pytest.raises(ContextMismatchError):
        unseal(seal(PLAINTEXT), context=expected)


def test_edited_context_fails_the_key_commitment() -> None:
    sealed = seal(PLAINTEXT)
    forged = sealed.replace(b"\x00\x03100", b"\x00\x03200", 1)
    assert forged != sealed
    with pytest.raises(HeaderAuthenticationError):
        unseal(forged, context=StreamContext("acme", "job-1", 200, "model"))


def test_another_jobs_key_cannot_unwrap() -> None:
    with pytest.raises(KeyUnwrapError):
        unseal(seal(PLAINTEXT), keys=job_keys())


def test_a_data_key_other_than_the_writers_fails_the_commitment() -> None:
    class WrongDataKey:
        def unwrap(self, envelope: bytes) -> bytes:
            return os.urandom(32)

    with pytest.raises(HeaderAuthenticationError):
        StreamDecryptor(io.BytesIO(seal(PLAINTEXT)), context=CONTEXT, unwrapper=WrongDataKey())


def test_rewrap_changes_only_the_envelope() -> None:
    old_keys = KEYS
    new_keys = JobKeys("acme", "job-1", {**old_keys.keys, 2: JobKey("acme", "job-1", 2, os.urandom(32))})
    sealed = seal(PLAINTEXT, keys=old_keys)
    header = StreamHeader.read(io.BytesIO(sealed))
    rewrapped = rewrap_header(header, old_keys, new_keys.current)
    moved = rewrapped.encode() + sealed[header_length(sealed) :]
    assert rewrapped.digested_bytes == header.digested_bytes
    assert rewrapped.key_envelope != header.key_envelope
    assert unseal(moved, keys=JobKeys("acme", "job-1", {2: new_keys.current})) == PLAINTEXT
    with pytest.raises(UnknownKeyVersionError):
        unseal(moved, keys=old_keys)


MEMORY_PROBE = textwrap.dedent(
    """
    import os, sys
    from cantata.security.keys import JobKeys
    from cantata.security.stream_aead import StreamContext, StreamDecryptor, StreamEncryptor

    def memory_kib(field):  # VmRSS: now; VmHWM: peak since exec (ru_maxrss survives exec)
        line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
        return int(line.split()[1])

    total, path = int(sys.argv[1]), sys.argv[2]
    keys = JobKeys.from_json(sys.argv[3])
    context = StreamContext("acme", "job-1", 1, "big")
    chunk = os.urandom(4 << 20)
    baseline = memory_kib("VmRSS")
    with open(path, "wb") as sink:
        encryptor = StreamEncryptor(sink, context=context, wrapper=keys.current)
        for _ in range(total // len(chunk)):
            encryptor.write(chunk)
        encryptor.close()
    after_encrypt = memory_kib("VmHWM")
    with open(path, "rb") as source:
        plaintext = sum(len(segment) for segment in StreamDecryptor(source, context=context, unwrapper=keys))
    after_decrypt = memory_kib("VmHWM")
    print(plaintext, after_encrypt - baseline, after_decrypt - baseline)
    """
)


def test_encryption_and_decryption_stream_in_bounded_memory(tmp_path) -> None:
    total = 256 << 20
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(total), str(tmp_path / "big.sealed"), KEYS.to_json()],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    plaintext, encrypt_growth_kib, decrypt_growth_kib = map(int, result.stdout.split())
    assert plaintext == total
    assert encrypt_growth_kib < 16 * 1024
    assert decrypt_growth_kib < 16 * 1024


def _respelled_step(sealed: bytes, spelling: bytes) -> bytes:
    """``sealed`` with its context's step field ``b"100"`` written as ``spelling`` (length prefixes adjusted)."""
    old = b"".join(len(f).to_bytes(2, "big") + f for f in (b"acme", b"job-1", b"100", b"model"))
    new = b"".join(len(f).to_bytes(2, "big") + f for f in (b"acme", b"job-1", spelling, b"model"))
    at = sealed.index(len(old).to_bytes(2, "big") + old)
    return sealed[:at] + len(new).to_bytes(2, "big") + new + sealed[at + 2 + len(old) :]


# Spellings int() reads as 100: each would pass with the same key, binding and digest if parsed leniently.
STEP_SPELLINGS = [b"0100", b"+100", b"1_00", b" 100", b"100\n", "١٠٠".encode(), "１００".encode(), b"00000000100"]


@pytest.mark.parametrize("spelling", STEP_SPELLINGS, ids=repr)
def test_a_respelled_header_step_is_refused(spelling: bytes) -> None:
    """The digest pins every header byte: only the canonical ASCII decimal of the step is read."""
    sealed = seal(PLAINTEXT)
    respelled = _respelled_step(sealed, spelling)
    assert respelled != sealed
    with pytest.raises(MalformedHeaderError, match="canonical"):
        StreamHeader.read(io.BytesIO(respelled))
    with pytest.raises(MalformedHeaderError):
        unseal(respelled)
    assert unseal(_respelled_step(sealed, b"100")) == PLAINTEXT  # the helper changes nothing else
