"""The caller side of a gossip link: one ``Exchange`` call per stripe with one peer, then ``Commit``."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import grpc
import torch

from cantata.proto.v1 import gossip_pb2

from . import wire
from .bandwidth import TokenBucket
from .chunks import Assembly, CorruptPayload, to_chunks
from .wire import COMMIT, METHOD, WireCounter

COMMIT_RETRY_S = 0.05


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
    counter: WireCounter,
) -> None:
    """Send one stripe of ``payload`` and feed the peer's same stripe into ``assembly``.

    The callee ends its stream only after it has taken in all of ours, so a
    return means both sides hold each other's stripe.
    """
    call = channel.stream_stream(METHOD, request_serializer=counter.encode, response_deserializer=wire.decode)
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
    counter: WireCounter | None = None,
) -> None:
    """Swap ``payload`` with ``assembly.sender``, one stripe per channel in parallel.

    On return ``assembly`` holds the peer's whole payload. Raises
    ``grpc.RpcError`` (refused, unreachable, past ``timeout``) or ``CorruptPayload``.
    """
    errors: list[BaseException] = []
    counter = counter or WireCounter()

    def run(stripe: int) -> None:
        try:
            exchange_stripe(
                channels[stripe],
                round,
                sender,
                payload,
                assembly,
                stripe,
                len(channels),
                timeout,
                chunk_bytes,
                bucket,
                counter,
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


def commit_with(channel: grpc.Channel, round: int, sender: int, until: float, counter: WireCounter) -> bool:
    """Ask the callee to use the edge for ``round``; True if it keeps our payload.

    The request is idempotent: after a cut it is sent again (on a fresh
    connection if need be) until an answer comes or ``until`` (monotonic)
    passes; no answer counts as False.
    """
    call = channel.unary_unary(
        COMMIT,
        request_serializer=counter.serializer(gossip_pb2.GossipCommit.SerializeToString),
        response_deserializer=gossip_pb2.GossipCommitted.FromString,
    )
    request = gossip_pb2.GossipCommit(round=round, sender=sender)
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return False
        try:
            return bool(call(request, timeout=left, wait_for_ready=True).kept)
        except grpc.RpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return False
            time.sleep(min(COMMIT_RETRY_S, max(0.0, until - time.monotonic())))
