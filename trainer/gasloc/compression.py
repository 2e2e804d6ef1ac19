"""Compression of the gossip payload, with error feedback for the lossy codecs.

Each codec turns a flat float32 vector into one flat tensor for the wire and
back. Stated worst-case error per element:

- ``none``: exact (4 bytes per element).
- ``bf16``: ``|x - x̂| <= 2^-8 * |x|`` (round to nearest; 2 bytes per element).
- ``int8``: ``|x - x̂| <= max|block| / 254`` with one float32 scale per block of
  ``INT8_BLOCK`` elements (about 1.004 bytes per element).

``Compressor`` adds error feedback to a lossy codec: what rounding lost in one
round is added to the next round's input, so the decoded values sum to the
inputs' sum minus a single bounded residual.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from cantata.proto import vocabulary

INT8_BLOCK = 1024


class UnknownCompression(ValueError):
    """A compression name that is not one of ``COMPRESSIONS``."""


class Codec(ABC):
    """Encodes a flat float32 vector into one flat wire tensor."""

    name: str
    lossy: bool

    @abstractmethod
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The wire form of ``x`` (1-D float32)."""

    @abstractmethod
    def decode(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        """The float32 vector of ``numel`` elements that ``wire`` stands for."""


class Identity(Codec):
    name = "none"
    lossy = False

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def decode(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        if wire.dtype != torch.float32 or wire.numel() != numel:
            raise ValueError(f"expected {numel} float32 values, got {wire.numel()} {wire.dtype}")
        return wire


class BFloat16(Codec):
    name = "bf16"
    lossy = True

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)

    def decode(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        if wire.dtype != torch.bfloat16 or wire.numel() != numel:
            raise ValueError(f"expected {numel} bfloat16 values, got {wire.numel()} {wire.dtype}")
        return wire.to(torch.float32)


class Int8Blocks(Codec):
    """Symmetric int8 with one float32 scale (absmax / 127) per block.

    Wire layout (uint8): the float32 scales of every block, then one int8 per element.
    """

    name = "int8"
    lossy = True

    def __init__(self, block: int = INT8_BLOCK):
        self.block = block

    def _blocks(self, numel: int) -> int:
        return -(-numel // self.block)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        numel = x.numel()
        blocks = self._blocks(numel)
        padded = torch.zeros(blocks * self.block, dtype=torch.float32)
        padded[:numel] = x
        grid = padded.view(blocks, self.block)
        scales = grid.abs().amax(dim=1) / 127.0
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        q = torch.round(grid / safe[:, None]).clamp_(-127, 127).to(torch.int8).view(-1)[:numel]
        return torch.cat([scales.view(torch.uint8), q.view(torch.uint8)])

    def decode(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        blocks = self._blocks(numel)
        if wire.dtype != torch.uint8 or wire.numel() != 4 * blocks + numel:
            raise ValueError(f"expected {4 * blocks + numel} bytes of int8 blocks, got {wire.numel()}")
        scales = wire[: 4 * blocks].view(torch.float32)
        q = wire[4 * blocks :].view(torch.int8).to(torch.float32)
        padded = torch.zeros(blocks * self.block, dtype=torch.float32)
        padded[:numel] = q
        return (padded.view(blocks, self.block) * scales[:, None]).view(-1)[:numel]


COMPRESSIONS = tuple(name.value for name in vocabulary.Compression)


def make_codec(name: str) -> Codec:
    codecs = {"none": Identity, "bf16": BFloat16, "int8": Int8Blocks}
    if name not in codecs:
        raise UnknownCompression(f"unknown compression {name!r}; expected one of {', '.join(COMPRESSIONS)}")
    return codecs[name]()


class Compressor:
    """A codec plus, for lossy codecs, the error-feedback residual of one sender."""

    def __init__(self, name: str = "none", error_feedback: bool = True):
        self.codec = make_codec(name)
        self.error_feedback = error_feedback and self.codec.lossy
        self.residual: torch.Tensor | None = None

    def compress(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(wire, decoded)`` for ``x``; ``decoded`` is what every receiver will see."""
        target = x if self.residual is None else x + self.residual
        wire = self.codec.encode(target)
        decoded = self.codec.decode(wire, x.numel())
        if self.error_feedback:
            self.residual = target - decoded
        return wire, decoded

    def decompress(self, wire: torch.Tensor, numel: int) -> torch.Tensor:
        return self.codec.decode(wire, numel)
