"""The token-shard format: round trips and every way a shard can be refused."""

import struct
import zlib

import numpy as np
import pytest

from cantata.trainer.data import ShardChecksumError, ShardHeaderError, ShardTruncatedError
from cantata.trainer.data.shards import HEADER_SIZE, decode_shard, dtype_for, encode_shard

NAME = "s3://bucket/corpus/shard-00001.tok"


@pytest.mark.parametrize("dtype_name", ["uint16", "uint32"])
def test_round_trip_keeps_tokens_and_dtype(dtype_name):
    tokens = np.arange(0, 70_000, 7) % (255 if dtype_name == "uint16" else 70_000)
    data = encode_shard(tokens, dtype_for(dtype_name))
    decoded = decode_shard(data, NAME)
    assert decoded.dtype == dtype_for(dtype_name)
    assert len(data) == HEADER_SIZE + tokens.size * decoded.dtype.itemsize
    np.testing.assert_array_equal(decoded, tokens)


def test_token_too_wide_for_dtype_is_refused():
    with pytest.raises(ValueError, match="70000 does not fit uint16"):
        encode_shard(np.array([1, 70_000]), dtype_for("uint16"))


def test_checksums_are_zlibs_crc32_of_the_header_and_of_the_tokens():
    data = encode_shard(np.arange(100_000) % 60_000, dtype_for("uint16"))
    _, _, _, _, _, tokens_crc, header_crc = struct.unpack_from("<4sBBHQII", data)
    assert header_crc == zlib.crc32(data[:20])
    assert tokens_crc == zlib.crc32(data[HEADER_SIZE:])


def _shard() -> bytearray:
    return bytearray(encode_shard(np.arange(1000) % 256, dtype_for("uint16")))


def test_bad_magic_names_the_shard():
    data = _shard()
    data[:4] = b"NOPE"
    with pytest.raises(ShardHeaderError, match=f"shard {NAME}: bad magic"):
        decode_shard(data, NAME)


def test_unknown_version_is_refused():
    data = _shard()
    data[4] = 9
    with pytest.raises(ShardHeaderError, match="unsupported format version 9"):
        decode_shard(data, NAME)


def test_changed_count_fails_the_header_checksum():
    data = _shard()
    struct.pack_into("<Q", data, 8, 999)
    with pytest.raises(ShardHeaderError, match=f"shard {NAME}: header checksum mismatch"):
        decode_shard(data, NAME)


def test_unknown_width_is_refused_even_with_a_consistent_header_checksum():
    data = _shard()
    data[5] = 3
    struct.pack_into("<I", data, 20, zlib.crc32(bytes(data[:20])))
    with pytest.raises(ShardHeaderError, match="unknown token width 3"):
        decode_shard(data, NAME)


def test_flipped_token_bit_fails_the_token_checksum():
    data = _shard()
    data[HEADER_SIZE + 100] ^= 0x01
    with pytest.raises(ShardChecksumError, match=f"shard {NAME}: token checksum mismatch"):
        decode_shard(data, NAME)


def test_truncated_body_is_refused():
    with pytest.raises(ShardTruncatedError, match=f"shard {NAME}: 1023 bytes, its header promises 2024"):
        decode_shard(_shard()[:1023], NAME)


def test_truncated_header_is_refused():
    with pytest.raises(ShardTruncatedError, match="shorter than its 24-byte header"):
        decode_shard(_shard()[:10], NAME)


def test_trailing_bytes_are_refused():
    with pytest.raises(ShardTruncatedError, match="3 bytes follow its 1000 tokens"):
        decode_shard(_shard() + b"xyz", NAME)
