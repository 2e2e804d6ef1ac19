import pytest
import torch

from cantata.trainer.gasloc import Compressor, UnknownCompression
from cantata.trainer.gasloc.compression import INT8_BLOCK

torch.set_num_threads(1)


def _vector(numel=3 * INT8_BLOCK + 17, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g) * torch.logspace(-3, 1, numel)
    x[INT8_BLOCK : 2 * INT8_BLOCK] = 0.0  # an all-zero block
    return x


def test_none_is_exact_and_full_size():
    x = _vector()
    wire, decoded = Compressor("none").compress(x)
    assert wire.dtype == torch.float32 and torch.equal(decoded, x)


def test_bf16_round_trip_within_relative_bound():
    x = _vector()
    c = Compressor("bf16", error_feedback=False)
    wire, decoded = c.compress(x)
    assert wire.numel() * wire.element_size() == 2 * x.numel()
    assert torch.equal(c.decompress(wire, x.numel()), decoded)
    assert ((decoded - x).abs() <= 2.0**-8 * x.abs()).all()


def test_int8_round_trip_within_per_block_bound():
    x = _vector()
    c = Compressor("int8", error_feedback=False)
    wire, decoded = c.compress(x)
    blocks = -(-x.numel() // INT8_BLOCK)
    assert wire.dtype == torch.uint8 and wire.numel() == 4 * blocks + x.numel()
    assert torch.equal(c.decompress(wire, x.numel()), decoded)
    for b in range(blocks):
        part = slice(b * INT8_BLOCK, (b + 1) * INT8_BLOCK)
        bound = x[part].abs().max() / 254 * (1 + 1e-5)
        assert (decoded[part] - x[part]).abs().max() <= bound
    assert (decoded[INT8_BLOCK : 2 * INT8_BLOCK] == 0).all()


def test_malformed_wire_is_rejected():
    c = Compressor("int8")
    with pytest.raises(ValueError):
        c.decompress(torch.zeros(10, dtype=torch.uint8), 100)
    with pytest.raises(UnknownCompression):
        Compressor("fp4")


@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_error_feedback_accumulates_the_residual(name):
    x = torch.full((INT8_BLOCK,), 1.0 + 1e-3)
    x[0] = 3.0  # makes int8's step coarse for the other elements
    rounds = 50
    with_ef, without_ef = Compressor(name), Compressor(name, error_feedback=False)
    sent_ef = torch.zeros_like(x)
    sent_plain = torch.zeros_like(x)
    for _ in range(rounds):
        sent_ef += with_ef.compress(x)[1]
        sent_plain += without_ef.compress(x)[1]
    # What error feedback has not sent yet is exactly its residual...
    assert torch.allclose(sent_ef + with_ef.residual, rounds * x, atol=1e-4)
    # ...which stays within the codec's one-round bound, while plain rounding keeps its bias.
    bound = 2.0**-8 * x.abs() * 1.01 if name == "bf16" else torch.full_like(x, 3.0 / 254 * 1.01)
    assert (with_ef.residual.abs() <= bound).all()
    assert (sent_plain - rounds * x).abs().max() > 10 * (sent_ef - rounds * x).abs().max()
