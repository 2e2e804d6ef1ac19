"""A worker's gossip endpoint: serves its payload and exchanges it with the round's peers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc
import torch

from cantata.security.pki import Bundle

from .bandwidth import TokenBucket
from .chunks import DEFAULT_CHUNK_BYTES, CorruptPayload, dtype_name
from .client import commit_with, exchange_with
from .heap import reuse_message_memory
from .identity import gossip_server_name
from .mailbox import Mailbox
from .reduce import Reduced, Reduction, Reductions
from .service import GossipService, RefusalHook, add_gossip_service
from .wire import REDUCE, WireCounter, decode

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often a waiting round asks ``gone()`` which peers will not come

GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]


class GossipNode:
    """The gossip endpoint of worker ``worker_index`` of ``job_id``, over mutual TLS.

        node = GossipNode(i, job_id, bundle)          # bundle: this worker's per-job Bundle
        address = node.start()                        # "127.0.0.1:PORT", for the control plane
        got = node.exchange(round, {j: addr_j, ...}, payload)   # {j: peer payload}; missing = skipped
        total, traffic = node.allreduce(round, {j: addr_j, ...}, vector)  # the sum (see :mod:`.reduce`)
        node.stop()

    For each edge the lower worker index dials and the higher one answers; both
    directions stream at once, split into ``streams`` stripes on as many
    connections so TLS work spreads over cores; then the caller commits the
    edge (see :mod:`.mailbox`), so both ends use it or neither. A peer that
    is refused, unreachable, reset, corrupt or not done by the round's
    deadline is missing from the result; a failed link ends its wait at once.
    While it waits, ``gone()`` is asked every ``POLL_S`` which peers will not
    come this round (dead, or done with the round without this node), and
    their edges are given up at once. ``bytes_sent`` counts every message this
    node serialized for sending.
    """

    def __init__(
        self,
        worker_index: int,
        job_id: str,
        bundle: Bundle,
        listen: str = "127.0.0.1:0",
        deadline_s: float = 30.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        streams: int = 2,
        on_refused: RefusalHook | None = None,
        commit_grace_s: float = 5.0,
    ):
        self.worker_index = worker_index
        self.job_id = job_id
        self.bundle = bundle
        self.listen = listen
        self.deadline_s = deadline_s
        self.chunk_bytes = chunk_bytes
        self.streams = streams
        self.commit_grace_s = commit_grace_s
        self.mailbox = Mailbox()
        self.reductions = Reductions()
        self.wire = WireCounter()
        self._on_refused = on_refused or (lambda address, principal, reason: None)
        self._buckets: dict[int, TokenBucket] = {}
        self._channels: dict[tuple[int, str], list[grpc.Channel]] = {}
        self._lock = threading.Lock()
        self._dialer = ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"gossip-dial-{worker_index}")
        self._server: grpc.Server | None = None
        self.address: str | None = None

    def start(self) -> str:
        """Start serving; return the bound ``host:port``."""
        reuse_message_memory(self.chunk_bytes)
        server = grpc.server(
            ThreadPoolExecutor(max_workers=32, thread_name_prefix=f"gossip-serve-{self.worker_index}"),
            options=GRPC_OPTIONS,
        )
        service = GossipService(
            self.job_id,
            self.worker_index,
            self.mailbox,
            self.deadline_s,
            self.chunk_bytes,
            self._buckets.get,
            self._on_refused,
            self.reductions,
        )
        add_gossip_service(service, server, self.wire)
        credentials = grpc.ssl_server_credentials(
            [(self.bundle.key_pem, self.bundle.cert_pem)],
            root_certificates=self.bundle.ca_pem,
            require_client_auth=True,
        )
        port = server.add_secure_port(self.listen, credentials)
        if port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        server.start()
        self._server = server
        self.address = f"{self.listen.rsplit(':', 1)[0]}:{port}"
        return self.address

    def set_link_rate(self, peer: int, bytes_per_s: float | None) -> None:
        """Cap what this worker sends to ``peer`` (None lifts the cap)."""
        if bytes_per_s is None:
            self._buckets.pop(peer, None)
        else:
            self._buckets[peer] = TokenBucket(bytes_per_s, burst=self.chunk_bytes)

    @property
    def bytes_sent(self) -> int:
        return self.wire.total

    def exchange(
        self,
        round: int,
        peers: Mapping[int, str],
        payload: torch.Tensor | Mapping[int, torch.Tensor],
        deadline_s: float | None = None,
        gone: Callable[[], Iterable[int]] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Swap ``payload`` (1-D; or ``{peer: payload}``, all of one size and dtype) with every peer
        ``{index: address}`` for ``round``; only these peers may exchange with this node in ``round``.

        Returns ``{peer: payload}`` for the edges used. The returned tensors
        live in receive buffers that the next ``exchange`` reuses: use or copy
        them before calling it again.
        """
        if self._server is None:
            raise RuntimeError("start() the node before exchanging")
        deadline = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        if isinstance(payload, torch.Tensor):
            default, per_peer = _flat(payload), {}
        else:
            per_peer = {peer: _flat(payload[peer]) for peer in peers}
            default = next(iter(per_peer.values()), torch.empty(0))
            if len({(p.numel(), p.dtype) for p in per_peer.values()}) > 1:
                raise ValueError("payloads to different peers differ in size or dtype")
        self.mailbox.post(round, peers, default, per_peer)
        for peer, address in peers.items():
            if peer > self.worker_index:
                self._dialer.submit(self._dial, round, peer, address, per_peer.get(peer, default), deadline)
        if gone is not None:
            while not self.mailbox.settled(round, min(deadline, time.monotonic() + POLL_S)):
                if time.monotonic() >= deadline:
                    break
                for peer in gone():
                    self.mailbox.fail(round, peer)
        received = self.mailbox.collect(round, deadline, self.commit_grace_s + 1.0)  # past the last commit answer
        missing = sorted(set(peers) - received.keys())
        if missing:
            log.warning("gossip round %d: worker %d skips peers %s", round, self.worker_index, missing)
        return received

    def allreduce(
        self,
        round: int,
        peers: Mapping[int, str],
        vector: torch.Tensor,
        deadline_s: float | None = None,
        gone: Callable[[], Iterable[int]] | None = None,
        wire_dtype: torch.dtype | None = None,
    ) -> Reduced:
        """The sum of the 1-D float ``vector`` over this worker and ``peers`` ``{index: address}``, each of which
        calls it for the same ``round`` (rounds only grow) with a vector of the same size; chunks travel as
        ``wire_dtype`` (default: the vector's). Raises ``AllReduceFailed`` unless every member took part in time.
        """
        if self._server is None:
            raise RuntimeError("start() the node before an all-reduce")
        deadline = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        members = sorted({self.worker_index, *peers})
        reduction = Reduction(round, vector, members, self.worker_index, wire_dtype, self.chunk_bytes, deadline)
        self.reductions.open(reduction)
        try:
            for peer, address in peers.items():
                if peer > self.worker_index:
                    self._dialer.submit(self._dial_reduce, reduction, peer, address)
            total = reduction.wait(gone)
        finally:
            self.reductions.close(reduction)
        return Reduced(total, reduction.traffic())

    def _dial_reduce(self, reduction: Reduction, peer: int, address: str) -> None:
        """The caller's side of the all-reduce's stream with ``peer``; any failure fails the all-reduce."""
        error: BaseException | None = None
        try:
            call = self._link(peer, address)[0].stream_stream(
                REDUCE, request_serializer=self.wire.encode, response_deserializer=decode
            )
            responses = call(  # a connection still being set up (TLS on a loaded host) is waited for, to the deadline
                reduction.outgoing(peer, self._buckets.get(peer)),
                timeout=max(0.0, reduction.deadline - time.monotonic()),
                wait_for_ready=True,
            )
            reduction.on_fail(responses.cancel)
            for chunk in responses:
                reduction.take(peer, chunk)
        except Exception as failure:  # refused, unreachable, cut, corrupt: the all-reduce fails closed
            error = failure
            if isinstance(failure, grpc.RpcError):
                log.warning(
                    "all-reduce round %d: worker %d -> %d failed: %s",
                    reduction.round,
                    self.worker_index,
                    peer,
                    failure.details(),
                )
        reduction.closed(peer, error)

    def _dial(self, round: int, peer: int, address: str, payload: torch.Tensor, deadline: float) -> None:
        assembly = self.mailbox.assembly(round, peer)
        if assembly is None:
            return
        link = self._link(peer, address)
        try:
            exchange_with(
                link,
                round,
                self.worker_index,
                payload,
                assembly,
                timeout=max(0.0, deadline - time.monotonic()),
                chunk_bytes=self.chunk_bytes,
                bucket=self._buckets.get(peer),
                counter=self.wire,
            )
        except (grpc.RpcError, CorruptPayload) as error:
            detail = error.details() if isinstance(error, grpc.RpcError) else str(error)
            log.warning("gossip round %d: worker %d -> %d failed: %s", round, self.worker_index, peer, detail)
            self.mailbox.fail(round, peer)
            return
        if self.mailbox.begin_commit(assembly):
            kept = commit_with(link[0], round, self.worker_index, deadline + self.commit_grace_s, self.wire)
            self.mailbox.end_commit(assembly, kept)

    def _link(self, peer: int, address: str) -> list[grpc.Channel]:
        """``streams`` channels to ``peer``, each with its own connection."""
        with self._lock:
            key = (peer, address)
            if key not in self._channels:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=self.bundle.ca_pem,
                    private_key=self.bundle.key_pem,
                    certificate_chain=self.bundle.cert_pem,
                )
                options = GRPC_OPTIONS + [
                    ("grpc.ssl_target_name_override", gossip_server_name(self.job_id, peer)),
                    ("grpc.use_local_subchannel_pool", 1),
                    # a cut link is retried within a round, not after gRPC's default backoff of up to 2 minutes
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    # gRPC reads this one as the least time a connection attempt gets (TCP, mutual TLS and
                    # HTTP/2 settings: several round trips); at 100 ms every attempt over a 50 ms RTT timed out
                    ("grpc.min_reconnect_backoff_ms", 5000),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ]
                self._channels[key] = [
                    grpc.secure_channel(address, credentials, options=options) for _ in range(self.streams)
                ]
            return self._channels[key]

    def stop(self, grace: float | None = None) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        self._dialer.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for link in self._channels.values():
                for channel in link:
                    channel.close()
            self._channels.clear()

    def __enter__(self) -> GossipNode:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _flat(payload: torch.Tensor) -> torch.Tensor:
    flat = payload.detach().reshape(-1).contiguous().cpu()
    dtype_name(flat.dtype)  # raises here, not in a link thread, for a dtype the wire cannot carry
    return flat
