"""Gossip transport: symmetric parameter exchange between a job's workers over mutual TLS."""

from .bandwidth import TokenBucket
from .chunks import CorruptPayload
from .identity import PeerRefused, gossip_server_name
from .node import GossipNode

__all__ = ["CorruptPayload", "GossipNode", "PeerRefused", "TokenBucket", "gossip_server_name"]
