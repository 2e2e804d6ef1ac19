"""GASLoC: local steps, gossip with a few peers, and an accelerated outer step.

DiLoCo is the complete-graph case (``make_topology("complete", n)``).
"""

from .compression import COMPRESSIONS, Compressor, UnknownCompression
from .outer import Exchange, GASLoCOuter, OuterStep, RoundStats, Screen, flatten
from .simulator import Simulator
from .topology import TOPOLOGIES, Topology, UnknownTopology, make_topology

__all__ = [
    "COMPRESSIONS",
    "TOPOLOGIES",
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
