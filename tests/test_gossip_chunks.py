import pytest
import torch

from cantata.proto.v1 import gossip_pb2
from cantata.trainer.gossip import CorruptPayload, TokenBucket, bandwidth, wire
from cantata.trainer.gossip.chunks import Assembly, to_chunks
from cantata.trainer.gossip.wire import Chunk

torch.set_num_threads(1)


def _chunks(payload, round=3, sender=1, chunk_bytes=1000):
    return list(to_chunks(round, sender, payload, chunk_bytes))


def test_chunks_reassemble_bit_exact():
    payload = torch.randn(1234).to(torch.bfloat16)
    chunks = _chunks(payload)
    assert len(chunks) == 3 and all(c.count == 3 and c.total_bytes == 2468 for c in chunks)
    assembly = Assembly(3, 1, bytearray(2468))
    for c in chunks:
        assembly.add(c)
    assert torch.equal(assembly.tensor(), payload)


def test_empty_payload_round_trips():
    assembly = Assembly(3, 1, bytearray(0))
    for c in _chunks(torch.empty(0)):
        assembly.add(c)
    assert assembly.tensor().numel() == 0


@pytest.mark.parametrize("damage", ["flip", "reorder", "drop", "round", "sender", "header"])
def test_damaged_streams_are_rejected(damage):
    chunks = _chunks(torch.randn(1000))
    if damage == "flip":
        chunks[1].data = bytes([chunks[1].data[0] ^ 1]) + chunks[1].data[1:]
    elif damage == "reorder":
        chunks[1], chunks[2] = chunks[2], chunks[1]
    elif damage == "drop":
        del chunks[-1]
    elif damage == "round":
        chunks[2].round = 4
    elif damage == "sender":
        chunks[0].sender = 2
    elif damage == "header":
        chunks[1].total_bytes += 1
    assembly = Assembly(3, 1, bytearray(4000))
    with pytest.raises(CorruptPayload):
        for c in chunks:
            assembly.add(c)
        assembly.tensor()


class _Clock:
    def __init__(self):
        self.now = 0.0
        self.slept = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_token_bucket_paces_to_its_rate(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(bandwidth.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(bandwidth.time, "sleep", clock.sleep)
    bucket = TokenBucket(rate=1000, burst=500)
    bucket.take(500)  # the burst goes at once
    assert clock.slept == []
    bucket.take(1000)
    assert clock.slept == [pytest.approx(1.0)]
    clock.now += 10  # idle time refills only up to the burst
    bucket.take(1000)
    assert clock.slept[-1] == pytest.approx(0.5)
    assert clock.now == pytest.approx(11.5)  # 2500 bytes at 1000 B/s after a 500 B burst (+10 s idle)


def test_wire_codec_speaks_the_generated_protobuf_format():
    data = bytes(range(256)) * 300
    ours = Chunk(
        round=2**40,
        sender=7,
        index=3,
        count=9,
        total_bytes=10**10,
        dtype="bfloat16",
        checksum=0xDEADBEEF12345678,
        data=memoryview(data),
    )
    parsed = gossip_pb2.GossipChunk.FromString(wire.encode(ours))
    assert (
        parsed.round,
        parsed.sender,
        parsed.index,
        parsed.count,
        parsed.total_bytes,
        parsed.dtype,
        parsed.checksum,
        parsed.data,
    ) == (2**40, 7, 3, 9, 10**10, "bfloat16", 0xDEADBEEF12345678, data)
    back = wire.decode(parsed.SerializeToString())
    assert (back.round, back.sender, back.dtype, back.checksum, bytes(back.data)) == (
        2**40,
        7,
        "bfloat16",
        0xDEADBEEF12345678,
        data,
    )


def test_wire_codec_rejects_truncated_messages():
    raw = wire.encode(Chunk(1, 0, 0, 1, 5, "uint8", 0, memoryview(b"hello")))
    with pytest.raises(wire.MalformedChunk):
        wire.decode(raw[:-2])


def test_stripes_reassemble_in_any_interleaving_and_all_are_required():
    payload = torch.randn(5000)
    stripes = [list(to_chunks(3, 1, payload, 1500, None, k, 3)) for k in range(3)]
    assert sum(len(c.data) for s in stripes for c in s) == payload.numel() * 4
    assembly = Assembly(3, 1, bytearray(20000))
    for chunk in stripes[2] + stripes[0]:
        assembly.add(chunk)
    assert not assembly.complete
    with pytest.raises(CorruptPayload):
        assembly.tensor()
    for chunk in stripes[1]:
        assembly.add(chunk)
    assert torch.equal(assembly.tensor(), payload)


def test_stripe_count_must_agree_across_chunks():
    payload = torch.randn(100)
    assembly = Assembly(3, 1, bytearray(400))
    assembly.add(next(to_chunks(3, 1, payload, 1 << 20, None, 0, 2)))
    with pytest.raises(CorruptPayload):
        assembly.add(next(to_chunks(3, 1, payload, 1 << 20, None, 1, 3)))


def test_payload_of_another_size_is_refused_before_allocating():
    huge = Chunk(3, 1, 0, 1, 1 << 50, "uint8", 0, memoryview(b""))
    with pytest.raises(CorruptPayload, match="expected 400"):
        Assembly(3, 1, bytearray(400)).add(huge)


@pytest.mark.parametrize("damage", ["short", "long", "block swap", "word swap"])
def test_chunks_whose_data_no_longer_matches_their_checksum_are_refused(damage):
    payload = torch.randn(3 * 4096)  # 48 KiB in chunks of 16 KiB
    chunks = _chunks(payload, chunk_bytes=16384)
    data = bytes(chunks[1].data)
    if damage == "short":
        chunks[1].data = data[:-4]
        chunks[2].data = data[-4:] + bytes(chunks[2].data)  # the stripe still adds up to its size
    elif damage == "long":
        chunks[1].data = data + bytes(chunks[2].data)[:4]
        chunks[2].data = bytes(chunks[2].data)[4:]
    elif damage == "block swap":
        chunks[1].data = data[4096:8192] + data[:4096] + data[8192:]
    elif damage == "word swap":  # two 8-byte words trade places: every byte and every sum is unchanged
        chunks[1].data = data[8:16] + data[:8] + data[16:]
    assembly = Assembly(3, 1, bytearray(payload.numel() * 4))
    with pytest.raises(CorruptPayload, match="chunk 1 of stripe 0 fails its checksum"):
        for c in chunks:
            assembly.add(c)
