"""The callee side of a gossip link: the ``Gossip`` gRPC service of one worker."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn, Protocol

import grpc

from cantata.proto.v1 import gossip_pb2
from cantata.security.pki import Principal

from . import wire
from .bandwidth import TokenBucket
from .chunks import MAX_STRIPES, Assembly, to_chunks
from .identity import PeerRefused, authorize_peer
from .mailbox import Mailbox
from .reduce import Reduction, Reductions
from .wire import Chunk

log = logging.getLogger(__name__)

RefusalHook = Callable[[str, str, str], None]
"""``on_refused(peer_address, principal, reason)``: called for every refused caller (for the audit log);
``principal`` is the URI its verified certificate names, "" if none."""


class ServicerContext(Protocol):
    """What the service uses of a ``grpc.ServicerContext``, typed: ``abort`` always raises."""

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn: ...

    def auth_context(self) -> dict[str, list[bytes]]: ...

    def peer(self) -> str: ...


class GossipService:
    """Answers a peer's ``Exchange`` (streams this worker's stripe while taking in the peer's), ``Commit`` and
    ``Reduce`` (streams this worker's side of the round's all-reduce while taking in the peer's)."""

    def __init__(
        self,
        job_id: str,
        worker_index: int,
        mailbox: Mailbox,
        wait_s: float,
        chunk_bytes: int,
        link_bucket: Callable[[int], TokenBucket | None],
        on_refused: RefusalHook,
        reductions: Reductions | None = None,
    ):
        self.job_id = job_id
        self.worker_index = worker_index
        self.mailbox = mailbox
        self.wait_s = wait_s
        self.chunk_bytes = chunk_bytes
        self.link_bucket = link_bucket
        self.on_refused = on_refused
        self.reductions = reductions or Reductions()

    def identify(self, context: ServicerContext) -> int:
        """The caller's worker index, from its verified certificate; aborts anyone else."""
        try:
            return authorize_peer(context.auth_context(), self.job_id, self.worker_index)
        except PeerRefused as refusal:
            self._refuse(context, refusal.principal, str(refusal))

    def _refuse(self, context: ServicerContext, principal: str, reason: str) -> NoReturn:
        log.warning("gossip refused %s: %s", context.peer(), reason)
        self.on_refused(context.peer(), principal, reason)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)

    def Exchange(self, request_iterator: Iterator[Chunk], context: ServicerContext) -> Iterator[Chunk]:
        peer = self.identify(context)
        first = next(request_iterator, None)
        if first is None:
            return
        if first.sender != peer:
            self._refuse(
                context, Principal.worker(self.job_id, peer).uri, f"worker {peer} sent chunks as worker {first.sender}"
            )
        if not 0 <= first.stripe < first.stripes <= MAX_STRIPES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"stripe {first.stripe} of {first.stripes}")
        payload = self.mailbox.outgoing(first.round, self.wait_s, peer)
        assembly = self.mailbox.assembly(first.round, peer)
        if payload is None or assembly is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"round {first.round} is not open here")
        failure: list[BaseException] = []
        receiver = threading.Thread(
            target=self._receive, args=(first, request_iterator, assembly, failure), daemon=True
        )
        receiver.start()
        yield from to_chunks(
            first.round,
            self.worker_index,
            payload,
            self.chunk_bytes,
            self.link_bucket(peer),
            first.stripe,
            first.stripes,
        )
        receiver.join()
        if failure:
            self.mailbox.fail(first.round, peer)
            context.abort(grpc.StatusCode.DATA_LOSS, f"payload from worker {peer} rejected: {failure[0]}")
        if assembly.complete:
            self.mailbox.received(assembly)

    def Commit(self, request: gossip_pb2.GossipCommit, context: ServicerContext) -> gossip_pb2.GossipCommitted:
        peer = self.identify(context)
        if request.sender != peer:
            self._refuse(
                context, Principal.worker(self.job_id, peer).uri, f"worker {peer} committed as worker {request.sender}"
            )
        return gossip_pb2.GossipCommitted(kept=self.mailbox.commit(request.round, peer))

    def Reduce(self, request_iterator: Iterator[Chunk], context: ServicerContext) -> Iterator[Chunk]:
        peer = self.identify(context)
        first = next(request_iterator, None)
        if first is None:
            return
        if first.sender != peer:
            self._refuse(
                context, Principal.worker(self.job_id, peer).uri, f"worker {peer} sent chunks as worker {first.sender}"
            )
        reduction = self.reductions.get(first.round, self.wait_s)
        if reduction is None or peer not in reduction.peers:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"no all-reduce of round {first.round} with {peer}")
        receiver = threading.Thread(target=_take_all, args=(reduction, peer, first, request_iterator), daemon=True)
        receiver.start()
        yield from reduction.outgoing(peer, self.link_bucket(peer))
        if not reduction.failure:  # the caller ends its stream once it holds all this worker sent it
            receiver.join(timeout=max(0.0, reduction.deadline - time.monotonic()))
        if reduction.failure or receiver.is_alive():
            context.abort(grpc.StatusCode.ABORTED, reduction.failure or "the caller did not end its stream in time")

    @staticmethod
    def _receive(first: Chunk, rest: Iterator[Chunk], assembly: Assembly, failure: list[BaseException]) -> None:
        try:
            assembly.add(first)
            for chunk in rest:
                assembly.add(chunk)
        except Exception as error:  # a corrupt stream or a cancelled call: the peer is skipped
            log.warning("gossip round %d: payload from worker %d rejected: %s", first.round, first.sender, error)
            failure.append(error)


def _take_all(reduction: Reduction, peer: int, first: Chunk, rest: Iterator[Chunk]) -> None:
    """Feed ``peer``'s stream into ``reduction``; any error (corrupt chunk, cut stream) fails it."""
    error: BaseException | None = None
    try:
        reduction.take(peer, first)
        for chunk in rest:
            reduction.take(peer, chunk)
    except Exception as failure:  # the all-reduce fails closed on any broken stream
        error = failure
    reduction.closed(peer, error)


def add_gossip_service(service: GossipService, server: grpc.Server, counter: wire.WireCounter | None = None) -> None:
    """Serve ``cantata.v1.Gossip`` with the zero-copy chunk codec; ``counter`` adds up the bytes sent."""
    counter = counter or wire.WireCounter()
    exchange = grpc.stream_stream_rpc_method_handler(
        service.Exchange, request_deserializer=wire.decode, response_serializer=counter.encode
    )
    commit = grpc.unary_unary_rpc_method_handler(
        service.Commit,
        request_deserializer=gossip_pb2.GossipCommit.FromString,
        response_serializer=counter.serializer(gossip_pb2.GossipCommitted.SerializeToString),
    )
    reduce = grpc.stream_stream_rpc_method_handler(
        service.Reduce, request_deserializer=wire.decode, response_serializer=counter.encode
    )
    handlers = {"Exchange": exchange, "Commit": commit, "Reduce": reduce}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("cantata.v1.Gossip", handlers),))
