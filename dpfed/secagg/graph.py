"""Who masks and shares with whom: the SecAgg+ neighbour graph (Bell et al., CCS 2020).

Classic SecAgg (Bonawitz et al., CCS 2017) uses the complete graph: every site agrees masks with
and secret-shares to every other site, O(K) work and messages per site. SecAgg+ (Bell, Bonawitz,
Gascon, Lepoint & Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead",
CCS 2020, sections 3-4) replaces it by a sparse k-regular graph with k = O(log K): a site masks
only with its k neighbours and shares its secrets among them, and security and correctness hold
with overwhelming probability provided the graph is random and *not chosen by the server*.

Graph (``NeighbourGraph``). The Harary graph H(k, K) (k even): place the K sites on a ring and
join each to the k/2 nearest on either side; then relabel the ring positions by a permutation of
the sorted site ids. The permutation is a Fisher-Yates shuffle driven by SHA-256 in counter mode
over DOMAIN || the round's configuration digest (public round randomness; ``protocol.RoundConfig``
binds the round id, the site list and every parameter), so every party computes the same graph
and nobody picks it alone. (A party that can grind round ids gets about one extra graph per
try; at the 2^-40 level below that is immaterial, but the round id should not be chosen by the
aggregator after it learns who the corrupt sites are.) A site's *holders* are its closed
neighbourhood N(u) + {u}: it keeps one share of each of its own secrets (as in Bonawitz et al.,
where shares go to all of U_1 including u), which lets it answer for its own self-mask.

Parameters (``choose_graph_parameters``), for K sites of which at most a fraction gamma are
corrupt (colluding with the aggregator) and at most a fraction delta drop out, following the
analysis of Bell et al. (section 4, random Harary graphs) in the form used by Google's open
implementation (``fcp/secagg/server/graph_parameter_finder.cc``), with failure probabilities
2^-sigma (security, sigma = 40) and 2^-eta (correctness, eta = 20). For even k = 2, 4, ...:

1. *Honest survivors stay connected.* Removing a set S from a Harary ring disconnects it only if
   S covers two disjoint runs of k/2 consecutive positions (k positions). Under the random
   relabelling the probability that k given positions are all bad (corrupt or dropped, at most
   B = floor(gamma K) + floor(delta K) sites) is (B)_k / (K)_k (falling factorials), and there are
   at most K (K - k - 1)/2 pairs of runs, so P(disconnected) <= K (K-k-1)/2 (B)_k/(K)_k, which must
   be < 2^-(sigma+1). (A disconnected honest graph would let the server learn partial sums.)
2. *Few corrupt holders.* The number of corrupt neighbours of a site is hypergeometric
   Hyp(K - 1, floor(gamma K), k); c is the smallest value it exceeds with probability
   <= 2^-(sigma+1) / K (union bound over the K sites).
3. *Enough surviving holders.* The surviving neighbours of a dropped site are
   Hyp(K - 1, K - floor(delta K), k); s is the largest value with P(fewer than s) <= 2^-eta / K.
   (A surviving site has one more: itself.)
4. *Threshold.* Against an honest-but-curious aggregator t must exceed the corrupt holders:
   t = c + 1. Against an aggregator that may lie about who dropped out ("semi_malicious",
   Bonawitz et al., section 6.2 and Bell et al., section 5), honest holders reveal at most one of
   (b_u share, s_u share) each, so obtaining both secrets of u needs 2t <= (k + 1) + c; hence
   t = floor((k + 1 + c)/2) + 1. The degree is accepted when t <= s; t >= 2 always.

The first accepted k is O(log K) for fixed gamma, delta (Bell et al., Theorem 3.6):
tests/test_secagg_graph.py checks the growth. For K <= ``COMPLETE_GRAPH_MAX`` (small hospital
federations, where O(K) is cheap) or when no k < K - 1 passes, the complete graph is used with
c = floor(gamma K) and the same threshold rules over K holders; a round then tolerates up to
K - t dropouts.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from dpfed.secagg.errors import ParameterError, UnknownSender
from dpfed.secagg.keys import DOMAIN

__all__ = ["ADVERSARIES", "COMPLETE_GRAPH_MAX", "GraphParameters", "choose_graph_parameters",
           "NeighbourGraph", "hypergeometric_logpmf"]

ADVERSARIES = ("semi_honest", "semi_malicious")
COMPLETE_GRAPH_MAX = 64
_EPS = 1e-12


@dataclass(frozen=True)
class GraphParameters:
    """Degree k (neighbours, not counting the site itself; K - 1 for the complete graph),
    Shamir threshold t over the k + 1 holders, and the bounds the choice rests on."""

    n_sites: int
    degree: int
    threshold: int
    complete: bool
    corrupt_holders: int
    surviving_holders: int
    adversary: str


def hypergeometric_logpmf(x: int, population: int, successes: int, draws: int) -> float:
    """log P(X = x), X ~ Hyp(population, successes, draws) (-inf outside the support)."""
    if x < max(0, draws - (population - successes)) or x > min(draws, successes):
        return -math.inf

    def lchoose(n, r):
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)
    return (lchoose(successes, x) + lchoose(population - successes, draws - x)
            - lchoose(population, draws))


def _upper_quantile(population, successes, draws, tail) -> int:
    """Smallest c with P(X > c) <= tail."""
    probs = [math.exp(hypergeometric_logpmf(x, population, successes, draws))
             for x in range(draws + 1)]
    above = 0.0
    for c in range(draws, -1, -1):
        # above = P(X > c)
        if above > tail:
            return c + 1
        above += probs[c]
    return 0


def _lower_quantile(population, successes, draws, tail) -> int:
    """Largest s with P(X < s) <= tail."""
    probs = [math.exp(hypergeometric_logpmf(x, population, successes, draws))
             for x in range(draws + 1)]
    below = 0.0
    for s in range(0, draws + 1):
        # below = P(X < s)
        if below + probs[s] > tail:
            return s
        below += probs[s]
    return draws


def _threshold(holders: int, corrupt: int, adversary: str) -> int:
    if adversary == "semi_honest":
        t = corrupt + 1
    else:
        t = (holders + corrupt) // 2 + 1
    return max(t, 2)


def choose_graph_parameters(n_sites: int, *, dropout_fraction: float = 0.1,
                            corrupt_fraction: float = 0.1, adversary: str = "semi_malicious",
                            security_bits: float = 40.0, correctness_bits: float = 20.0,
                            complete_up_to: int = COMPLETE_GRAPH_MAX,
                            corrupt_sites: int | None = None) -> GraphParameters:
    """Degree and threshold for ``n_sites`` sites (module docstring for the rules).

    ``corrupt_sites``: the number of colluding sites the round tolerates (the spec's c); when
    given it replaces floor(corrupt_fraction K), so the Shamir threshold counts exactly the
    colluders the round was signed for (method.md section 12)."""
    K = n_sites
    if isinstance(K, bool) or not isinstance(K, int) or K < 2:
        raise ParameterError("secure aggregation needs at least 2 sites")
    if adversary not in ADVERSARIES:
        raise ParameterError(f"adversary must be one of {ADVERSARIES}")
    for name, f in (("dropout_fraction", dropout_fraction),
                    ("corrupt_fraction", corrupt_fraction)):
        if not (0 <= f < 1):
            raise ParameterError(f"{name} must be in [0, 1)")
    corrupt = int(math.floor(corrupt_fraction * K + _EPS))
    if corrupt_sites is not None:
        if isinstance(corrupt_sites, bool) or not isinstance(corrupt_sites, int) \
                or not 0 <= corrupt_sites < K:
            raise ParameterError("corrupt_sites must be an integer in [0, K)")
        corrupt = corrupt_sites
    dropped = int(math.floor(dropout_fraction * K + _EPS))
    survivors = K - dropped
    if K > complete_up_to:
        log_sec = -(security_bits + 1) * math.log(2)
        sec_tail = 2.0 ** -(security_bits + 1) / K
        cor_tail = 2.0 ** -correctness_bits / K
        bad = corrupt + dropped
        for k in range(2, K - 1, 2):
            if k <= bad:
                log_p = (math.log(K) + math.log(K - k - 1) - math.log(2)
                         + math.lgamma(bad + 1) - math.lgamma(bad - k + 1)
                         + math.lgamma(K - k + 1) - math.lgamma(K + 1))
                if log_p >= log_sec:
                    continue
            c = _upper_quantile(K - 1, corrupt, k, sec_tail)
            s = _lower_quantile(K - 1, survivors, k, cor_tail)
            t = _threshold(k + 1, c, adversary)
            if t <= s:
                return GraphParameters(K, k, t, False, c, s, adversary)
    t = _threshold(K, corrupt, adversary)
    if t > survivors:
        raise ParameterError(
            f"no threshold works for {K} sites: t = {t} exceeds the {survivors} survivors "
            f"(corrupt fraction {corrupt_fraction}, dropout fraction {dropout_fraction})")
    return GraphParameters(K, K - 1, t, True, corrupt, survivors, adversary)


def _permutation(n: int, seed: bytes) -> list[int]:
    """A Fisher-Yates permutation of range(n) driven by SHA-256(seed || counter), unbiased
    (rejection of the top partial interval of each 64-bit draw)."""
    counter = 0
    buf = b""

    def draw64() -> int:
        nonlocal counter, buf
        if len(buf) < 8:
            buf += hashlib.sha256(seed + counter.to_bytes(8, "little")).digest()
            counter += 1
        out, buf = int.from_bytes(buf[:8], "little"), buf[8:]
        return out

    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (2 ** 64 // bound) * bound
        while True:
            r = draw64()
            if r < limit:
                break
        j = r % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class NeighbourGraph:
    """The k-regular neighbour graph of one round over ``site_ids`` (module docstring).

    ``degree`` = K - 1 gives the complete graph (no permutation needed)."""

    def __init__(self, site_ids: Sequence[str], degree: int, seed: bytes):
        ids = tuple(site_ids)
        if len(set(ids)) != len(ids) or list(ids) != sorted(ids):
            raise ParameterError("site ids must be distinct and sorted")
        K = len(ids)
        if K < 2:
            raise ParameterError("a graph needs at least 2 sites")
        complete = degree == K - 1
        if not complete and (degree < 2 or degree % 2 or degree >= K - 1):
            raise ParameterError(f"degree must be even in [2, K - 2] or K - 1, got {degree}")
        self.site_ids = ids
        self.degree = degree
        self.complete = complete
        self._index = {s: i for i, s in enumerate(ids)}
        if complete:
            self._neighbours = {s: tuple(v for v in ids if v != s) for s in ids}
            return
        perm = _permutation(K, DOMAIN + b"neighbour-graph" + bytes(seed))
        ring = [ids[p] for p in perm]          # ring position -> site id
        half = degree // 2
        self._neighbours = {}
        for pos, site in enumerate(ring):
            nb = {ring[(pos + off) % K] for off in range(-half, half + 1) if off}
            self._neighbours[site] = tuple(sorted(nb))

    def __len__(self) -> int:
        return len(self.site_ids)

    def _check(self, site: str) -> None:
        if site not in self._index:
            raise UnknownSender(f"site {site!r} is not in the round")

    def neighbours(self, site: str) -> tuple[str, ...]:
        """N(site), sorted."""
        self._check(site)
        return self._neighbours[site]

    def holders(self, site: str) -> tuple[str, ...]:
        """N(site) + {site}, sorted: the sites that hold shares of site's secrets."""
        return tuple(sorted((*self.neighbours(site), site)))

    def are_neighbours(self, a: str, b: str) -> bool:
        self._check(a)
        self._check(b)
        return b in self._neighbours[a]

    def index(self, site: str) -> int:
        """The Shamir x-coordinate of ``site``: its 1-based position in the sorted site list."""
        self._check(site)
        return self._index[site] + 1

    def site_at(self, index: int) -> str:
        if not 1 <= index <= len(self.site_ids):
            raise UnknownSender(f"no site at index {index}")
        return self.site_ids[index - 1]

    def edges(self) -> set[tuple[str, str]]:
        return {(a, b) for a in self.site_ids for b in self._neighbours[a] if a < b}

    def is_connected(self, among: Iterable[str] | None = None) -> bool:
        """Whether the subgraph induced by ``among`` (default: all sites) is connected."""
        nodes = set(self.site_ids if among is None else among)
        if not nodes:
            return True
        start = next(iter(nodes))
        seen, stack = {start}, [start]
        while stack:
            for v in self._neighbours[stack.pop()]:
                if v in nodes and v not in seen:
                    seen.add(v)
                    stack.append(v)
        return seen == nodes
