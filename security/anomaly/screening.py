"""Screening of one incoming update against what this worker knows.

Every update a worker receives, a gossip neighbour's proposed point or an
all-reduce contribution, is screened before it is mixed in. The screener
works in the receiver's frame: ``update`` is the peer's vector minus the
receiver's round-start parameters (for an all-reduce contribution: the peer's
pseudo-gradient) and ``own`` is the receiver's own update in the same frame.

Four checks, each giving a score and a verdict (and a fifth, below):

- ``finite``: the number of NaN/Inf entries; any is a rejection, and the other
  checks are skipped since nothing else about the vector can be measured (a
  vector whose squared norm overflows float32 is rejected the same way).
- ``difference_norm``: ``r = ||update - own|| / ||own||``, scored as a robust
  z-score against this peer's own history (median and MAD over a window).
  Until the window holds ``warmup`` values the reference is a fixed prior.
- ``cosine``: cosine similarity with the receiver's own update (its
  pseudo-gradient); below fixed thresholds it is clipped or rejected, unless
  the peer's own history shows such values are normal for it (a peer far
  away on a sparse graph drifts towards orthogonal honestly).
- ``layer_norms``: per layer (of at least ``min_layer_size`` elements), how
  much further the layer is from the receiver's than the whole vector is,
  each against the peer's history; the score is the largest z, so one
  poisoned matrix cannot hide inside a large, otherwise normal vector.

With a ``canary`` (what the receiver added to its own point before sending
it, a small random vector that only it knows), a fifth check comes first:

- ``echo``: ``<update - own, canary> / ||canary||^2``, how much of the
  receiver's own canary comes back in the peer's vector. An honest peer's
  point was made before it saw the receiver's payload, so the echo is noise
  around 0 (about ``||update - own|| / (sqrt(D) ||canary||)``). A vector
  crafted from the receiver's payload, as dissensus and the other omniscient
  attacks craft theirs, carries the canary: dissensus
  ``y - epsilon * (x_h - y)`` echoes it ``1 + epsilon`` times. An update
  whose echo is above ``echo_reject`` and at least ``echo_min_z`` times that
  honest noise is rejected, so a small model (few parameters, a noisier
  echo) does not lose honest peers to it.

Only values from updates that were not rejected enter a peer's history, so an
attacker that is rejected from the first round never shapes its reference.

A peer in quarantine grace (``lenient``: restarted, or late, a few rounds ago)
may be far off for an honest reason: it lagged, and while its neighbours
rejected it they drifted apart from it and from each other, past the history
they knew. For such a peer a ``difference_norm`` rejection is a clip instead:
the update is mixed at the peer's typical norm (pulling the models together
again) and its ratio enters the history capped at the clip threshold, so the
reference moves to where the peers now are by at most that much per value,
never to an attacker's scale. Every other check rejects it as before.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

import torch

_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its sigma
_EPS = 1e-12
CANARY_SCALE = 0.05  # canary norm over the own update's: echo noise about 0.1 here, negligible mixing noise


class Verdict(IntEnum):
    """What the mixing does with an update; larger is stricter."""

    ACCEPT = 0
    CLIP = 1
    REJECT = 2


@dataclass(frozen=True)
class CheckResult:
    """One check's statistic and the verdict it implies."""

    check: str
    score: float
    verdict: Verdict


@dataclass(frozen=True)
class ScreeningResult:
    """All checks on one update; the overall verdict is the strictest one.

    ``clip_norm`` is set when the verdict is CLIP: the difference norm
    ``||update - own||`` the mixing should clip this peer to, the peer's
    typical (median) difference norm.
    """

    peer: int
    checks: tuple[CheckResult, ...]
    clip_norm: float | None = None

    @property
    def verdict(self) -> Verdict:
        return max(check.verdict for check in self.checks)

    def scores(self) -> dict[str, float]:
        return {check.check: check.score for check in self.checks}


class RoundScreening(dict[int, ScreeningResult]):
    """One round's results by peer, and the Gram matrix of the peers' pulls.

    A pull is a peer's vector less the point the receiver sent (its own
    point plus the canary). ``pull_gram`` gives ``opposition_from_gram`` its
    cosines without another pass over the vectors.
    """

    def __init__(self, results: Mapping[int, ScreeningResult], peers: tuple[int, ...], gram: torch.Tensor):
        super().__init__(results)
        self._rows = {peer: row for row, peer in enumerate(peers)}
        self._gram = gram

    def pull_gram(self, peers: Iterable[int]) -> torch.Tensor:
        """The float64 Gram matrix of ``peers``' pulls, in that order."""
        rows = [self._rows[peer] for peer in peers]
        return self._gram[rows][:, rows]


@dataclass(frozen=True)
class ScreeningConfig:
    """Thresholds of the checks.

    ``clip_z``/``reject_z`` bound the robust z-scores of the checks;
    ``cosine_clip``/``cosine_reject`` bound the cosine similarity, and once a
    peer is warm a low cosine must also lie ``clip_z``/``reject_z`` spreads
    below the peer's median cosine (spread at least ``cosine_min_spread``).
    ``prior_ratio``/``prior_spread`` stand in for the median and the spread of
    a peer's norm ratio until ``warmup`` values are in its window (a layer's
    share: 1 and ``prior_share_spread``). ``min_relative_spread`` floors the
    norm ratio's spread at that fraction of its median, and
    ``layer_min_spread`` floors a share's spread, so a very steady peer does
    not make every small change look anomalous.
    ``min_layer_size`` leaves small layers (biases, norms) to the whole-vector
    check: their ratios are too noisy to screen one by one.
    """

    window: int = 16
    warmup: int = 4
    clip_z: float = 6.0
    reject_z: float = 12.0
    cosine_clip: float = -0.1
    cosine_reject: float = -0.2
    cosine_min_spread: float = 0.05
    prior_ratio: float = 1.5
    prior_spread: float = 0.4
    prior_share_spread: float = 0.25
    min_relative_spread: float = 0.3
    layer_min_spread: float = 0.1
    min_layer_size: int = 1024
    echo_reject: float = 0.5
    echo_min_z: float = 5.0

    def __post_init__(self) -> None:
        if self.window < 1 or not 0 <= self.warmup <= self.window:
            raise ValueError("need window >= 1 and 0 <= warmup <= window")
        if not 0 < self.clip_z <= self.reject_z:
            raise ValueError("need 0 < clip_z <= reject_z")
        if not -1 <= self.cosine_reject <= self.cosine_clip <= 1:
            raise ValueError("need -1 <= cosine_reject <= cosine_clip <= 1")
        spreads = (self.prior_spread, self.prior_share_spread, self.cosine_min_spread, self.layer_min_spread)
        if min(spreads) <= 0 or self.min_relative_spread < 0:
            raise ValueError("prior and minimum spreads must be > 0, min_relative_spread >= 0")
        if self.min_layer_size < 1:
            raise ValueError("min_layer_size must be >= 1")
        if self.echo_reject <= 0 or self.echo_min_z <= 0:
            raise ValueError("echo_reject and echo_min_z must be > 0")


@dataclass(frozen=True)
class LayerLayout:
    """Where each layer lies in the flat parameter vector: ``bounds[k]:bounds[k+1]``."""

    names: tuple[str, ...]
    bounds: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.names) + 1 or self.bounds[0] != 0:
            raise ValueError("bounds must start at 0 and have one more entry than names")
        if any(b <= a for a, b in itertools.pairwise(self.bounds)):
            raise ValueError("every layer must hold at least one element")

    @classmethod
    def from_shapes(cls, named_shapes: Iterable[tuple[str, torch.Size | tuple[int, ...]]]) -> LayerLayout:
        names, bounds = [], [0]
        for name, shape in named_shapes:
            names.append(name)
            bounds.append(bounds[-1] + math.prod(shape))
        return cls(tuple(names), tuple(bounds))

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> LayerLayout:
        """The layout ``parameters_to_vector(module.parameters())`` produces."""
        return cls.from_shapes((name, p.shape) for name, p in module.named_parameters())

    @property
    def size(self) -> int:
        return self.bounds[-1]

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in itertools.pairwise(self.bounds))


class RobustWindow:
    """The last ``size`` values of a vector of statistics, summarized by median and MAD.

    The values live in one ``[size, m]`` tensor written round-robin, so a
    round's windows stack without copying each value again.
    """

    def __init__(self, size: int):
        self._size = size
        self._buffer: torch.Tensor | None = None
        self._count = 0
        self._next = 0

    def __len__(self) -> int:
        return self._count

    def add(self, values: torch.Tensor) -> None:
        if self._buffer is None:
            self._buffer = values.new_empty(self._size, *values.shape)
        self._buffer[self._next] = values
        self._next = (self._next + 1) % self._size
        self._count = min(self._count + 1, self._size)

    def values(self) -> torch.Tensor:
        """``[len, m]``: the values, in no particular order (the median and MAD do not depend on it)."""
        if self._buffer is None:
            raise ValueError("the window is empty")
        return self._buffer[: self._count]

    def median_and_spread(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per statistic, the median and ``1.4826 * MAD`` (a normal sample's sigma)."""
        return median_and_spread(self.values())


def median_and_spread(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Median and ``1.4826 * MAD`` over the second-to-last dimension (windows stacked on the first)."""
    median = values.median(dim=-2).values
    mad = (values - median.unsqueeze(-2)).abs().median(dim=-2).values
    return median, _MAD_TO_SIGMA * mad


# row b: the signs (+1 or -1) that the 8 bits of byte b stand for, least significant first
_BYTE_SIGNS = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).to(torch.float32).mul_(2).sub_(1)


def make_canary(own: torch.Tensor, scale: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random vector of norm ``scale * ||own||`` for the receiver to add to the point it sends (``echo``).

    Each entry is ``+s`` or ``-s`` by one random bit: as secret as a Gaussian
    of the same norm (the echo of a vector independent of it has the same
    spread), and about a quarter of its cost, since 32 bits come from one draw.
    Drawn on the generator's device (the CPU without one) and moved to ``own``'s.
    """
    device = generator.device if generator is not None else torch.device("cpu")
    count = own.numel()
    words = torch.randint(-(2**31), 2**31, ((count + 31) // 32,), generator=generator, dtype=torch.int32, device=device)
    signs = _BYTE_SIGNS.to(device).index_select(0, words.view(torch.uint8).int()).view(-1)[:count]
    magnitude = scale * own.detach().to(torch.float32).norm() / math.sqrt(max(count, 1))
    return signs.view(own.shape).to(own.device).mul_(magnitude)


class UpdateScreener:
    """Screens the updates one worker receives, keeping a robust history per peer.

    A peer's history is a window of vectors ``[cosine, ratio, layer shares...]``
    taken from its updates that were not rejected. A layer's share compares
    how far the layer is from the receiver's with how far the whole vector is:
    ``(||d_l|| / ||own_l||) / (||d|| / ||own||)`` for ``d = update - own``, so
    it stays put while peers drift apart as a whole and jumps when one matrix
    is poisoned.
    """

    def __init__(self, layout: LayerLayout, config: ScreeningConfig | None = None):
        self.layout = layout
        self.config = config or ScreeningConfig()
        self._screened_layers = [k for k, size in enumerate(layout.layer_sizes) if size >= self.config.min_layer_size]
        if not self._screened_layers:
            raise ValueError(f"no layer holds min_layer_size={self.config.min_layer_size} elements")
        self._history: dict[int, RobustWindow] = {}
        self._block: torch.Tensor | None = None
        screened = len(self._screened_layers)
        self._prior = (
            torch.tensor([0.0, self.config.prior_ratio] + [1.0] * screened, dtype=torch.float64),
            torch.tensor(
                [1.0, self.config.prior_spread] + [self.config.prior_share_spread] * screened, dtype=torch.float64
            ),
        )

    def screen(self, peer: int, update: torch.Tensor, own: torch.Tensor) -> ScreeningResult:
        """Run every check on ``update`` from ``peer``; record it unless rejected."""
        return self.screen_round({peer: update}, own)[peer]

    def screen_round(
        self,
        received: Mapping[int, torch.Tensor],
        own: torch.Tensor,
        anchor: torch.Tensor | None = None,
        canary: torch.Tensor | None = None,
        lenient: frozenset[int] = frozenset(),
    ) -> RoundScreening:
        """Screen one round's vectors from several peers against the same ``own`` update.

        With ``anchor`` (the receiver's round-start parameters) the received
        vectors are the peers' points and their updates are ``received - anchor``;
        without it they are the updates already. ``canary``: what the
        receiver's sent point adds to its own (the ``echo`` check); None skips
        that check. ``lenient``: the peers in quarantine grace (see the module
        docstring). The vectors are copied once, into one float32 block of
        their differences from the receiver's point (with ``own`` and
        ``canary`` as two more rows), and every statistic comes from two
        passes over it: one norm per screened layer, and the block's Gram
        matrix (every row's squared norm, its products with ``own`` and
        ``canary``, and the pulls' Gram matrix that ``RoundScreening`` keeps).
        """
        if own.dim() != 1 or own.numel() != self.layout.size:
            raise ValueError(f"own must be a vector of {self.layout.size} elements")
        if any(vector.shape != own.shape for vector in received.values()) or (
            anchor is not None and anchor.shape != own.shape
        ):
            raise ValueError(f"every vector must have the shape of own, {tuple(own.shape)}")
        if canary is not None and canary.shape != own.shape:
            raise ValueError(f"canary must have the shape of own, {tuple(own.shape)}")
        if not received:
            return RoundScreening({}, (), torch.zeros(0, 0, dtype=torch.float64, device=own.device))
        peers = tuple(received)
        k = len(peers)
        own = own.detach().to(torch.float32)
        # one float32 block: the differences from the receiver's point, then own and the canary, so that
        # one pass over the layers and one product give every statistic; own's row holds the point first
        block = self._block_for(k + 1 + (canary is not None), own)
        reference = own if anchor is None else torch.add(anchor.detach(), own, out=block[k])
        for row, peer in enumerate(peers):  # one pass per vector: read it, subtract, write the row
            torch.sub(received[peer].detach(), reference, out=block[row])
        differences = block[:k]
        block[k].copy_(own)
        if canary is not None:
            block[k + 1].copy_(canary.detach())
        layers, gram = self._layer_square_sums(block[: k + 1]), self._gram(block)  # no layer needs the canary
        squares = gram.diagonal()
        own_layers, own_squared = layers[k], squares[k]
        products = gram[k:, :k]  # <d, own> and <d, canary> for every row d
        dots = products[0] + own_squared  # <update, own> with update = d + own
        echoes = None if canary is None else self._echoes(products[1], squares[k + 1].item())
        pulls = gram[:k, :k]
        if echoes is not None:  # the pulls are d - canary
            pulls = pulls - products[1][:, None] - products[1][None, :] + echoes[1]
        # every peer's statistics at once (per-peer tensor ops cost more than the arithmetic here)
        differences_squared = squares[:k]
        statistics = self._statistics(layers[:k], differences_squared, own_layers, own_squared, dots)
        own_norm = own_squared.sqrt().item()
        results, judged = {}, []
        for row, (peer, difference_squared) in enumerate(zip(peers, differences_squared.tolist(), strict=True)):
            if not math.isfinite(difference_squared):
                count = float((~torch.isfinite(differences[row])).sum().item())
                # a vector whose squares overflow float32 cannot be measured: rejected as well
                results[peer] = ScreeningResult(peer, (CheckResult("finite", max(count, 1.0), Verdict.REJECT),))
            elif echoes is not None and self._echoed(echoes[0][row], echoes[1], difference_squared):
                results[peer] = ScreeningResult(peer, (CheckResult("echo", echoes[0][row], Verdict.REJECT),))
            else:
                judged.append(row)
        if judged:
            rows = statistics[judged]
            warm, median, spread = self._references([peers[row] for row in judged], rows.device)
            z, values = ((rows - median) / spread).tolist(), rows.tolist()
            ratio_references = zip(median[:, 1].tolist(), spread[:, 1].tolist(), strict=True)
            for k, (row, (median_ratio, ratio_spread)) in enumerate(zip(judged, ratio_references, strict=True)):
                peer = peers[row]
                results[peer] = self._judge(
                    peer, rows[k], values[k][0], z[k], warm[k], (median_ratio, ratio_spread), own_norm, peer in lenient
                )
        return RoundScreening({peer: results[peer] for peer in peers}, peers, pulls)

    def _references(self, peers: list[int], device: torch.device) -> tuple[list[bool], torch.Tensor, torch.Tensor]:
        """Per peer: whether it is warm, and the median and spread its statistics are scored against.

        A warm peer's come from its window (the windows of one length in one batch), floored as the
        config says; a new peer's are the prior.
        """
        config = self.config
        histories = []
        for peer in peers:
            history = self._history.get(peer)
            histories.append(
                self._history.setdefault(peer, RobustWindow(config.window)) if history is None else history
            )
        warm = [len(history) >= max(config.warmup, 1) for history in histories]
        prior_median, prior_spread = (prior.to(device) for prior in self._prior)
        median = prior_median.expand(len(peers), -1).clone()
        spread = prior_spread.expand(len(peers), -1).clone()
        for length in {len(h) for h, w in zip(histories, warm, strict=True) if w}:
            rows = [k for k, (h, w) in enumerate(zip(histories, warm, strict=True)) if w and len(h) == length]
            window_median, window_spread = median_and_spread(torch.stack([histories[k].values() for k in rows]))
            median[rows] = window_median
            spread[rows] = torch.cat(
                [
                    window_spread[:, :1].clamp_min(config.cosine_min_spread),
                    torch.maximum(window_spread[:, 1:2], config.min_relative_spread * window_median[:, 1:2]).clamp_min(
                        _EPS
                    ),
                    window_spread[:, 2:].clamp_min(config.layer_min_spread),
                ],
                dim=1,
            )
        return warm, median, spread

    def _statistics(
        self,
        layers: torch.Tensor,
        differences_squared: torch.Tensor,
        own_layers: torch.Tensor,
        own_squared: torch.Tensor,
        dots: torch.Tensor,
    ) -> torch.Tensor:
        """``[k, 2 + S]``: per row, the cosine with own, the norm ratio and the screened layers' shares."""
        updates_squared = (differences_squared + 2 * dots - own_squared).clamp_min(0)
        cosines = (dots / (updates_squared.sqrt() * own_squared.sqrt()).clamp_min(_EPS)).clamp(-1, 1)
        ratios = (differences_squared / own_squared.clamp_min(_EPS)).sqrt()
        layer_ratios = (layers / own_layers.clamp_min(_EPS)).sqrt()
        shares = layer_ratios / ratios.clamp_min(_EPS)[:, None]
        return torch.cat([cosines[:, None], ratios[:, None], shares], dim=1)

    @staticmethod
    def _echoes(products: torch.Tensor, squared: float) -> tuple[list[float], float]:
        """Per row, ``<row - reference, canary> / ||canary||^2`` (0 for a zero canary), and ``||canary||^2``."""
        if squared == 0:
            return [0.0] * products.shape[0], 0.0
        return (products / squared).tolist(), squared

    def _echoed(self, echo: float, canary_squared: float, difference_squared: float) -> bool:
        """Above ``echo_reject``, and ``echo_min_z`` times the echo of a vector independent of the canary.

        That echo is ``N(0, ||d||^2 / (D ||canary||^2))`` for ``d = update - own`` in ``D`` dimensions.
        """
        noise = math.sqrt(difference_squared / (self.layout.size * canary_squared)) if canary_squared else math.inf
        return echo > self.config.echo_reject and echo > self.config.echo_min_z * noise

    def _block_for(self, rows: int, own: torch.Tensor) -> torch.Tensor:
        """A ``[rows, D]`` float32 buffer on ``own``'s device, kept from round to round (a new one each
        round costs a fresh allocation of several MB, and its page faults, on every screen)."""
        block = self._block
        if block is None or block.shape[0] != rows or block.device != own.device:
            block = self._block = torch.empty(rows, own.numel(), dtype=torch.float32, device=own.device)
        return block

    def _layer_square_sums(self, rows: torch.Tensor) -> torch.Tensor:
        """``[r, S]`` float64 sums of squares of each row's screened layers."""
        bounds = self.layout.bounds
        norms = [torch.linalg.vector_norm(rows[:, bounds[k] : bounds[k + 1]], dim=1) for k in self._screened_layers]
        return torch.stack(norms, dim=1).to(torch.float64).square()

    @staticmethod
    def _gram(rows: torch.Tensor) -> torch.Tensor:
        """``rows @ rows.T`` in float64, from one product per row with the rows from it on.

        For a handful of long rows these products read about half of what
        one matrix product does, and take about 0.6 of its time.
        """
        count = rows.shape[0]
        upper = rows.new_zeros(count, count)
        for i in range(count):
            torch.mv(rows[i:], rows[i], out=upper[i, i:])
        upper = upper.to(torch.float64)
        return upper + upper.triu(diagonal=1).T

    def _judge(
        self,
        peer: int,
        statistics: torch.Tensor,
        cosine: float,
        z: list[float],
        warm: bool,
        ratio_reference: tuple[float, float],
        own_norm: float,
        lenient: bool,
    ) -> ScreeningResult:
        """The verdicts on one peer from its ``[cosine, ratio, shares...]`` and their z-scores (``_references``);
        ``ratio_reference``: the median and spread its ratio was scored against; ``lenient``: it is in grace."""
        median_ratio, ratio_spread = ratio_reference
        distance = self._z_verdict(z[1])
        if lenient and distance is Verdict.REJECT:  # far off for lagging: clipped, its ratio capped in the history
            distance = Verdict.CLIP
            statistics = statistics.clone()
            statistics[1] = median_ratio + self.config.clip_z * ratio_spread
        checks = (
            CheckResult("finite", 0.0, Verdict.ACCEPT),
            CheckResult("difference_norm", z[1], distance),
            CheckResult("cosine", cosine, self._cosine_verdict(cosine, -z[0] if warm else None)),
            CheckResult("layer_norms", max(z[2:]), self._z_verdict(max(z[2:]))),
        )
        verdict = max(check.verdict for check in checks)
        if verdict is not Verdict.REJECT:
            self._history[peer].add(statistics)
        clip_norm = median_ratio * own_norm if verdict is Verdict.CLIP else None
        return ScreeningResult(peer, checks, clip_norm)

    def _z_verdict(self, z: float) -> Verdict:
        if z > self.config.reject_z:
            return Verdict.REJECT
        return Verdict.CLIP if z > self.config.clip_z else Verdict.ACCEPT

    def _cosine_verdict(self, cosine: float, drop_z: float | None) -> Verdict:
        """Below a threshold, and (once the peer is warm) that many spreads below its own median."""
        config = self.config
        if cosine < config.cosine_reject and (drop_z is None or drop_z > config.reject_z):
            return Verdict.REJECT
        if cosine < config.cosine_clip and (drop_z is None or drop_z > config.clip_z):
            return Verdict.CLIP
        return Verdict.ACCEPT
