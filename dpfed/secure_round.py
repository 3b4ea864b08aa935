"""Secure aggregation as a round mode: what the aggregator and every site derive, the same way,
from the coordinator-signed RoundSpec and the participants fixed when consent ends.

Pure functions and values (no gRPC, no roles): ``aggregator.rounds`` and ``site_node.secure``
both call them, so the two sides agree on the secure-aggregation configuration
(``dpfed.secagg.protocol.RoundConfig``: its digest is bound into every secagg message), on the
fixed-point grid and noise calibration (``dpfed.secagg.calibration.GridCalibration``) and on
the noise description every masked contribution declares and the unmasked sum carries.

Spec fields (protos/dpfed/v1/dpfed.proto, RoundSpec 22-26): ``aggregation`` ("independent"
default, "secure"); ``noise_threshold`` T; ``max_site_rows`` (public bound on a site's rows
that sizes the fixed-point grid, nothing else: sites encode exact integer statistics of all
their usable rows, ``dpfed.secagg.exact``, so no row count enters the sensitivity, and a sum
that outgrew the grid is refused after unmasking, ``SecureRound.decode_sum``); ``colluders`` c;
``site_key_ids`` (site -> key id of its identity key, the coordinator's anchor for the keys the
aggregator relays). The sum must hold at least ``min_contributors`` = max(quorum, T + c)
contributions before anything is unmasked.

Joint rounds (``spec.targets``, issue 23): the input is the joint vector of
``dpfed.joint_sensitivity.JointLayout(d, m, include_n=True)``, calibrated on the grid by
``dpfed.secagg.joint_calibration`` (Laplace: discrete Laplace shares per part; Gaussian:
distributed Skellam shares, charged with the Skellam RDP bound, ``SecureRound.event``), and
the unmasked sum decodes to that layout (``decode_joint_sum``).

Noise (docs/secure_aggregation.md, "Noise description"): each masked contribution declares,
per part, ``NoiseTerm("discrete_laplace", b/s, draws=1, grid=1/s, share=T)`` (a 1/T share of
one discrete Laplace draw on the grid); the sum of C contributions carries the merged term
``draws=C, share=T``: exactly NB(C/T) - NB(C/T), C/T draws' worth of variance (no rounding of
C/T to whole draws), at least one full draw since C >= T + c >= T.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives import serialization

from dpfed.noise import NoiseDescription, NoiseTerm
from dpfed.joint_sensitivity import JointLayout
from dpfed.secagg.calibration import GridCalibration, calibrate
from dpfed.secagg.joint_calibration import JointGridCalibration, calibrate_joint
from dpfed.secagg.codec import Reader, Writer
from dpfed.secagg.errors import MalformedMessage, ParameterError, SecAggError
from dpfed.secagg.fixedpoint import PARTS, StatisticsLayout
from dpfed.secagg.protocol import RoundConfig
from dpfed.sensitivity import noise_calibration, row_norm_bound
from dpfed.wire.canonical import canonical_bytes

__all__ = ["AGGREGATIONS", "INDEPENDENT", "SECURE", "aggregation", "is_secure",
           "min_contributors", "secure_problems", "SecureRound", "build", "encode_keys",
           "decode_keys", "vector_length", "SecureRoundError"]

INDEPENDENT, SECURE = "independent", "secure"
AGGREGATIONS = (INDEPENDENT, SECURE)
#: Upper limit of max_site_rows (dpfed.wire.limits.MAX_N).
MAX_SITE_ROWS = 10 ** 9
_KEYS_MAGIC = b"DSK1"


class SecureRoundError(ValueError):
    """The spec and participants do not make a feasible secure round; ``str`` says why."""


def aggregation(spec) -> str:
    """The spec's aggregation mode ("" = independent)."""
    return spec.aggregation or INDEPENDENT


def is_secure(spec) -> bool:
    return aggregation(spec) == SECURE


def min_contributors(spec) -> int:
    """Contributions the sum must hold before anything is unmasked: max(quorum, T + c)."""
    return max(int(spec.quorum), int(spec.noise_threshold) + int(spec.colluders))


def vector_length(d: int, m: int = 0) -> int:
    """Entries of one site's secure input: d(d+1)/2 + d + 2 (Sxx triangle, Sxy, Syy, n), or
    for a joint round of m >= 1 targets the joint layout's d(d+1)/2 + 1 + m d + 2 m
    (``JointLayout(d, m, include_n=True)``)."""
    if m:
        return JointLayout(d, m, include_n=True).size
    return StatisticsLayout(d).length


def is_joint(spec) -> bool:
    """A joint (multi-target) round: the spec names its targets (issue 23)."""
    return len(spec.targets) > 0


def _calibration(spec, n_sites: int) -> GridCalibration | JointGridCalibration:
    d = len(spec.feature_names)
    if is_joint(spec):
        # The real-unit calibration of the spec (dpfed.joint_noise: Laplace shares of
        # epsilon or Gaussian shares of mu^2), on the grid with Skellam for Gaussian rounds
        # (dpfed.secagg.joint_calibration).
        from dpfed.joint_noise import calibration_from_spec
        return calibrate_joint(calibration_from_spec(spec), n_max=int(spec.max_site_rows),
                               n_sites=n_sites, noise_threshold=int(spec.noise_threshold))
    # The round's own relation: a site uses every usable row (no cap), and its statistics are
    # exact integers (statistics="exact": no float-error term, so max_site_rows only sizes
    # the grid; site_node.secure, dpfed.secagg.exact).
    cal = noise_calibration(d, spec.epsilon, spec.x_bound, spec.y_bound,
                            list(spec.budget_split), neighbouring=spec.neighbouring or "add_remove",
                            xtx_sensitivity=spec.xtx_sensitivity or "exact",
                            x_norm_bound=row_norm_bound(spec.preprocessing.normalize_rows))
    return calibrate(d=d, n_max=int(spec.max_site_rows), n_sites=n_sites, x_bound=spec.x_bound,
                     y_bound=spec.y_bound, calibration=cal,
                     noise_threshold=int(spec.noise_threshold), statistics="exact")


def secure_problems(spec, invited: int) -> list[str]:
    """Everything wrong with the aggregation fields of a spec with ``invited`` sites, as
    sentences (empty: fine). Independent rounds must leave the secure fields unset; a secure
    round needs at least 2 sites, 1 <= T, T + c and quorum <= invited, a row bound, its
    invited sites named in ``sites`` with a key id pinned for each (``site_key_ids``, from the
    coordinator's own records: method.md section 12), and a fixed-point grid that cannot
    overflow with ``invited`` sites."""
    mode = aggregation(spec)
    if mode not in AGGREGATIONS:
        return [f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {spec.aggregation!r}"]
    problems = []
    if mode == INDEPENDENT:
        for name in ("noise_threshold", "max_site_rows", "colluders"):
            if getattr(spec, name):
                problems.append(f"{name} is for secure aggregation only (aggregation is "
                                f"independent)")
        if spec.site_key_ids:
            problems.append("site_key_ids is for secure aggregation only")
        return problems
    t, c = int(spec.noise_threshold), int(spec.colluders)
    if invited < 2:
        problems.append(f"secure aggregation needs at least 2 sites, {invited} invited: a single "
                        f"site has nobody to hide among (use aggregation = \"independent\")")
    if t < 1:
        problems.append("secure aggregation needs noise_threshold T >= 1 (the number of "
                        "honest noise shares that make one full draw)")
    elif t > invited:
        problems.append(f"noise_threshold T = {t} exceeds the {invited} invited site(s): the "
                        f"sum could never hold T noise shares")
    elif t + c > invited:
        problems.append(f"noise_threshold T = {t} plus colluders c = {c} exceeds the "
                        f"{invited} invited site(s)")
    if not 1 <= spec.max_site_rows <= MAX_SITE_ROWS:
        problems.append(f"secure aggregation needs max_site_rows in 1..{MAX_SITE_ROWS} (a public "
                        f"bound on each site's rows), got {spec.max_site_rows}")
    if not spec.sites:
        problems.append("a secure round must name its invited sites (sites is empty): the "
                        "coordinator pins each one's identity key (site_key_ids)")
    missing = sorted(s for s in set(spec.sites) if not spec.site_key_ids.get(s))
    if missing:
        problems.append(f"site_key_ids lists no key for invited site(s) {', '.join(missing)}")
    if not spec.aggregator_key_id:
        problems.append("a secure round must pin the aggregator's identity key "
                        "(aggregator_key_id, from the coordinator's own record): the sites "
                        "verify its signature on every secure-aggregation message it sends")
    if not problems and invited >= 2:
        try:
            _calibration(spec, invited)
        except (ParameterError, ValueError, SecAggError) as exc:
            problems.append(f"no fixed-point grid for this secure round: {exc}")
    return problems


@dataclass(frozen=True)
class SecureRound:
    """The secure-aggregation parameters of one round once its participants are fixed."""

    config: RoundConfig
    calibration: GridCalibration | JointGridCalibration

    @property
    def joint(self) -> bool:
        """A joint round (``JointGridCalibration``): the input is the joint vector."""
        return isinstance(self.calibration, JointGridCalibration)

    @property
    def sites(self) -> tuple[str, ...]:
        """The sites of the secure-aggregation configuration: the invited sites."""
        return self.config.site_ids

    @property
    def floor(self) -> int:
        """Fewest masked inputs that are unmasked (``RoundConfig.survivor_floor``)."""
        return self.config.survivor_floor

    def _shares(self, count: int) -> NoiseDescription:
        cal, t = self.calibration, self.calibration.noise_threshold
        if self.joint:
            # discrete Laplace or Skellam shares per part (JointGridCalibration)
            return cal.noise_description(count)
        terms = {}
        for part in PARTS:
            b, s = cal.grid_noise[part], cal.scales[part]
            terms[part] = () if b is None else (
                NoiseTerm("discrete_laplace", float(b) / float(s), count, 1.0 / float(s), t),)
        return NoiseDescription(**terms)

    def share_noise(self) -> NoiseDescription:
        """What one masked contribution declares: per noisy part one 1/T share of a discrete
        Laplace draw on that part's grid (module docstring)."""
        return self._shares(1)

    def decode_sum(self, vector) -> tuple:
        """(upper values, n) of the unmasked sum ``vector``, refused (``SumOutOfRange``, a
        SecAggError) when it may have wrapped modulo 2^64 or is implausible: its noisy n
        beyond the rows the grid holds (``GridCalibration.row_capacity``, a multiple of the
        invited sites x max_site_rows), or an entry beyond its bound given n. A site never
        refuses for having more rows than max_site_rows; this is where a federation that
        outgrew it is caught, after the DP release (post-processing)."""
        if self.joint:
            raise SecureRoundError("a joint round's sum is decoded by decode_joint_sum")
        upper, n = self.calibration.decode(vector)
        self.calibration.check_sum(upper, n, bound_name="max_site_rows")
        return upper, n

    def decode_joint_sum(self, vector) -> tuple:
        """(values in the joint layout ``JointStatistics.to_vector``, noisy n_x) of the
        unmasked sum of a joint round, refused (``SumOutOfRange``) as ``decode_sum`` refuses
        a sum that may have wrapped or is implausible (``JointGridCalibration.check_sum``).
        Counts are integers (scale 1), clamped at 0 after the check (post-processing, as the
        independent joint release clamps them: a noisy n_j of a rare response can be
        negative)."""
        if not self.joint:
            raise SecureRoundError("not a joint round: use decode_sum")
        values = self.calibration.decode(vector)
        self.calibration.check_sum(values, bound_name="max_site_rows")
        sl = JointLayout(self.calibration.d, self.calibration.m, include_n=True).slices()
        for part in ("n_x", "n"):
            values[sl[part]] = np.maximum(values[sl[part]], 0.0)
        return values, float(values[sl["n_x"]][0])

    def event(self):
        """The privacy event each patient of a joint round's release is charged
        (``dpfed.accounting``): PureDP(epsilon) for Laplace, the dominating Skellam event for
        Gaussian (``JointGridCalibration.event``). A single-target secure round charges
        PureDP(spec.epsilon), as it always has (site_node.secure)."""
        if not self.joint:
            raise SecureRoundError("a single-target secure round charges PureDP(spec.epsilon)")
        return self.calibration.event()

    def sum_noise(self, contributors: int) -> NoiseDescription:
        """The noise of the unmasked sum of ``contributors`` inputs: C shares of 1/T draw (the
        same as adding ``contributors`` times ``share_noise``). Refuses fewer than T."""
        if contributors < self.calibration.noise_threshold:
            raise SecureRoundError(f"{contributors} contribution(s) hold fewer than T = "
                                   f"{self.calibration.noise_threshold} noise shares")
        return self._shares(contributors)


def graph_seed(spec) -> bytes:
    """The public randomness of the round's neighbour graph: SHA-256 of the canonical bytes of
    the coordinator-signed spec (its round id, invited sites and every parameter). The
    aggregator cannot change it, so it cannot grind graphs (issue 19, item 6)."""
    return hashlib.sha256(b"dpfed.secure_round.graph\x00" + canonical_bytes(spec)).digest()


def build(spec, participants) -> SecureRound:
    """The SecureRound of ``spec`` with ``participants`` (the sites whose consent was
    recorded; sorted and deduplicated here); SecureRoundError says why it is infeasible.

    The secure-aggregation configuration is over the spec's *invited* sites (``spec.sites``,
    signed by the coordinator), not over the participants the aggregator reports: a site that
    did not consent is a site that dropped out before advertising keys. So the graph, the
    Shamir threshold t, the colluders c and the consensus quorum floor((K + c)/2) + 1 are fixed
    by signed data before anyone consents, and the aggregator's choice of participants can
    only drop sites, which the protocol tolerates up to its floors. (A spec without ``sites``,
    an open round, falls back to the participants.)"""
    ids = tuple(sorted(set(participants)))
    invited = tuple(sorted(set(spec.sites))) or ids
    floor = min_contributors(spec)
    outside = sorted(set(ids) - set(invited))
    if outside:
        raise SecureRoundError(f"participant(s) {', '.join(outside[:5])} are not invited")
    if len(ids) < 2:
        raise SecureRoundError(f"{len(ids)} participant(s): secure aggregation needs at least 2")
    if len(ids) < floor:
        raise SecureRoundError(f"{len(ids)} participant(s), fewer than the {floor} contributions "
                               f"the sum must hold (max of quorum {spec.quorum} and T + c = "
                               f"{spec.noise_threshold} + {spec.colluders})")
    try:
        config = RoundConfig.create(spec.round_id, invited,
                                    vector_length(len(spec.feature_names), len(spec.targets)),
                                    min_contributors=floor,
                                    noise_threshold=int(spec.noise_threshold),
                                    colluders=int(spec.colluders), seed=graph_seed(spec))
        calibration = _calibration(spec, len(invited))
    except (SecAggError, ValueError) as exc:
        raise SecureRoundError(f"infeasible secure round: {exc}") from None
    if len(ids) < config.survivor_floor:
        raise SecureRoundError(
            f"{len(ids)} participant(s) of {len(invited)} invited: fewer than the "
            f"{config.survivor_floor} survivors a secure round needs (Shamir threshold t = "
            f"{config.threshold}, consensus quorum {config.quorum} = floor((K + c)/2) + 1, "
            f"T + c = {config.noise_threshold + config.colluders})")
    return SecureRound(config, calibration)


def encode_keys(keys: dict[str, Ed25519PublicKey]) -> bytes:
    """The identity keys relayed in a "keys" notice: site id -> raw 32-byte Ed25519 key,
    sorted by site id (dpfed.secagg.codec)."""
    w = Writer().fixed(_KEYS_MAGIC, 4).u32(len(keys))
    for site in sorted(keys):
        raw = keys[site].public_bytes(serialization.Encoding.Raw,
                                      serialization.PublicFormat.Raw)
        w.text(site).fixed(raw, 32)
    return w.getvalue()


def decode_keys(data: bytes) -> dict[str, Ed25519PublicKey]:
    """Inverse of ``encode_keys``; SecureRoundError on anything else."""
    try:
        r = Reader(data)
        if r.fixed(4) != _KEYS_MAGIC:
            raise MalformedMessage("bad magic")
        n = r.u32()
        if n > 1 << 20:
            raise MalformedMessage("too many keys")
        out = {}
        previous = None
        for _ in range(n):
            site = r.text()
            if previous is not None and site <= previous:
                raise MalformedMessage("keys not sorted by site id")
            previous = site
            out[site] = Ed25519PublicKey.from_public_bytes(r.fixed(32))
        r.done()
    except (MalformedMessage, ValueError) as exc:
        raise SecureRoundError(f"malformed identity keys: {exc}") from None
    return out


def describe(spec) -> str:
    """One line for logs and status: 'secure, T = 3, c = 0, at most 500 rows per site'."""
    if not is_secure(spec):
        return INDEPENDENT
    return (f"secure, T = {spec.noise_threshold}, c = {spec.colluders}, at most "
            f"{spec.max_site_rows} rows per site")

