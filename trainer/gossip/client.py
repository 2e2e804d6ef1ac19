"""The caller side of a gossip link: one ``Exchange`` call per stripe with one peer."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import grpc
import torch

from . import wire
from .bandwidth import TokenBucket
from .chunks import Assembly, CorruptPayload, to_chunks
from .wire import METHOD


def exchange_stripe(
    channel: grpc.Channel,
    round: int,
    sender: int,
    payload: torch.Tensor,
    assembly: Assembly,
    stripe: int,
    stripes: int,
    timeout: float,
    chunk_bytes: int,
    bucket: TokenBucket | None,
) -> None:
    """Send one stripe of ``payload`` and feed the peer's same stripe into ``assembly``.

    The callee ends its stream only after it has taken in all of ours, so a
    return means both sides hold each other's stripe.
    """
    call = channel.stream_stream(METHOD, request_serializer=wire.encode, response_deserializer=wire.decode)
    responses = call(to_chunks(round, sender, payload, chunk_bytes, bucket, stripe, stripes), timeout=timeout)
    try:
        for chunk in responses:
            assembly.add(chunk)
    finally:
        responses.cancel()


def exchange_with(
    channels: Sequence[grpc.Channel],
    round: int,
    sender: int,
    payload: torch.Tensor,
    assembly: Assembly,
    timeout: float,
    chunk_bytes: int,
    bucket: TokenBucket | None = None,
) -> None:
    """Swap ``payload`` with ``assembly.sender``, one stripe per channel in parallel.

    On return ``assembly`` holds the peer's whole payload. Raises
    ``grpc.RpcError`` (refused, unreachable, past ``timeout``) or ``CorruptPayload``.
    """
    errors: list[BaseException] = []

    def run(stripe: int) -> None:
        try:
            exchange_stripe(
                channels[stripe], round, sender, payload, assembly, stripe, len(channels), timeout, chunk_bytes, bucket
            )
        except Exception as error:  # re-raised below, from the calling thread
            errors.append(error)

    helpers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(1, len(channels))]
    for helper in helpers:
        helper.start()
    run(0)
    for helper in helpers:
        helper.join()
    if errors:
        raise errors[0]
    if not assembly.complete:
        raise CorruptPayload("the peer ended its streams before its payload was complete")
