"""GASLoC: local steps, gossip with a few peers, and an accelerated outer step.

DiLoCo is the complete-graph case (``make_topology("complete", n)``); a DiLoCo
job averages with a ring all-reduce (``OuterStep.round_mean``) instead of
gossiping with every peer.
"""

from .compression import COMPRESSIONS, Compressor, UnknownCompression
from .outer import AllReduce, Exchange, GASLoCOuter, OuterStep, RoundStats, Screen, flatten
from .simulator import Simulator
from .topology import TOPOLOGIES, Topology, UnknownTopology, make_topology

__all__ = [
    "COMPRESSIONS",
    "TOPOLOGIES",
    "AllReduce",
    "Compressor",
    "Exchange",
    "GASLoCOuter",
    "OuterStep",
    "RoundStats",
    "Screen",
    "Simulator",
    "Topology",
    "UnknownCompression",
    "UnknownTopology",
    "flatten",
    "make_topology",
]
