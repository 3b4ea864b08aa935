"""Joint rounds at the aggregator (issue 23; docs/protocol.md "Joint rounds"): the checks of a
joint spec, the noise every contribution to it must declare, and the exact running sum of
its releases.

A joint round names m targets (RoundSpec.targets). Each site releases ONE joint vector
(dpfed.joint_statistics.JointStatistics; method.md section 13): Sxx once, over the n_x rows
whose features enter, and per target j (Sxy_j, Syy_j, n_j) over the rows that have response
j, every response standardised by its public TargetSpec (y - y_mean) / y_scale before it is
clipped to +-y_bound. Noise: "laplace" (pure epsilon per patient, per-part L1 calibration)
or "gaussian" ((epsilon, delta) per patient through the exact mu-GDP profile), both
calibrated by dpfed.joint_noise.calibration_from_spec, the one calibration the sites and
this aggregator share. Neighbouring is add/remove only (n_x and every n_j are noisy).

The sum is exact and order-independent like the single-target one (aggregator.exact_sum,
method.md section 3): every release is folded in as its JointStatistics.to_vector layout
[Sxx upper | n_x | Sxy_1..m | Syy_1..m | n_1..m] and the result rounded once.
"""

from __future__ import annotations

import math

import numpy as np

from dpfed import noise as dpnoise
from dpfed.v1 import dpfed_pb2 as pb

from aggregator.running_total import RunningTotal

# At most this many targets in one round: 262 GDSC drugs fit with room to spare; the joint
# vector of d = 512 features and 1024 targets is ~1.2 MB, inside the 4 MB payload limit.
MAX_TARGETS = 1024
MAX_TARGET_NAME_CHARS = 256


class JointRoundError(ValueError):
    """A joint release or sum that cannot be taken (wrong shape, non-finite values)."""


def is_joint(spec: pb.RoundSpec) -> bool:
    """Whether ``spec`` is a joint (multi-target) round: it names its targets."""
    return len(spec.targets) > 0


def target_names(spec: pb.RoundSpec) -> list[str]:
    return [t.name for t in spec.targets]


def mechanism_problems(spec: pb.RoundSpec) -> list[str]:
    """What is wrong with ``spec``'s mechanism and delta. A single-target round takes only
    the Laplace mechanism ("" or "laplace", delta 0); Gaussian noise is a joint round's."""
    from dpfed.joint_noise import MECHANISMS
    mech = spec.mechanism or "laplace"
    problems = []
    if mech not in MECHANISMS:
        return [f"mechanism must be one of {', '.join(MECHANISMS)}, got {spec.mechanism!r}"]
    if not is_joint(spec):
        if mech != "laplace":
            problems.append("mechanism \"gaussian\" needs a joint round (targets); a "
                            "single-target round is released with Laplace noise")
        if spec.delta != 0:
            problems.append("delta is for gaussian joint rounds only")
        return problems
    if mech == "gaussian":
        if not (math.isfinite(spec.delta) and 0 < spec.delta < 1):
            problems.append(f"a gaussian round needs 0 < delta < 1, got {spec.delta}")
    elif spec.delta != 0:
        problems.append(f"delta must be 0 under the laplace mechanism (pure epsilon-DP), "
                        f"got {spec.delta}")
    return problems


def joint_spec_problems(spec: pb.RoundSpec) -> list[str]:
    """Everything wrong with a joint spec's targets, relation and public statistics, as
    sentences (aggregator.aggregate.validate_spec adds them to its own); names only, never
    a data value."""
    problems = []
    m, d = len(spec.targets), len(spec.feature_names)
    if spec.target:
        problems.append("a joint round names its responses in targets: target must be empty")
    if m > MAX_TARGETS:
        problems.append(f"{m} targets (at most {MAX_TARGETS})")
    names = target_names(spec)
    bad = [i for i, t in enumerate(names) if not t or len(t) > MAX_TARGET_NAME_CHARS
           or not t.isprintable()]
    if bad:
        problems.append(f"target {bad[0] + 1} has an empty, non-printable or too long name "
                        f"(at most {MAX_TARGET_NAME_CHARS} characters)")
    if len(set(names)) != m:
        problems.append("target names are not unique")
    for t in spec.targets:
        if not math.isfinite(t.y_mean):
            problems.append(f"target {t.name!r}: y_mean must be finite")
        if not (math.isfinite(t.y_scale) and t.y_scale > 0):
            problems.append(f"target {t.name!r}: y_scale must be finite and > 0")
    if (spec.neighbouring or "add_remove") != "add_remove":
        problems.append("a joint round releases every count with noise: neighbouring must "
                        "be add_remove")
    if (spec.xtx_sensitivity or "exact") != "exact":
        problems.append("a joint round is calibrated with the exact Sxx sensitivity: "
                        "xtx_sensitivity must be exact (or empty)")
    if spec.public_statistics and d:
        problems += public_targets_problems(spec)
    return problems


def public_targets_problems(spec: pb.RoundSpec) -> list[str]:
    """The spec's public statistics must decode as m exact per-target statistics of the
    spec's dimension, each realisable (the Gram matrix of real rows)."""
    from dpfed.joint_statistics import PublicTargets
    from dpfed.statistics import realisable
    m, d = len(spec.targets), len(spec.feature_names)
    try:
        public = PublicTargets.from_bytes(spec.public_statistics)
    except ValueError as exc:
        return [f"public_statistics do not decode as per-target statistics: {exc}"]
    parts = list(public.targets)
    if len(parts) != m:
        return [f"public_statistics hold {len(parts)} targets' statistics, the spec names {m}"]
    problems = []
    for name, stats in zip(target_names(spec), parts):
        if stats.dim != d:
            problems.append(f"public statistics of target {name!r} have dimension "
                            f"{stats.dim}, spec has {d} features")
        elif not realisable(stats):
            problems.append(f"public statistics of target {name!r} are not the exact "
                            f"statistics of any rows")
    return problems


def public_targets(spec: pb.RoundSpec):
    """The spec's public per-target statistics (a tuple of m exact Statistics; Nones when
    the spec has no public rows)."""
    if not spec.public_statistics:
        return (None,) * len(spec.targets)
    from dpfed.joint_statistics import PublicTargets
    from dpfed.noise import EXACT
    public = PublicTargets.from_bytes(spec.public_statistics)
    return tuple(s.with_noise(EXACT) for s in public.targets)


def calibration(spec: pb.RoundSpec):
    """The joint calibration of ``spec`` (dpfed.joint_noise.calibration_from_spec): scales,
    per-part budgets, the event each patient pays. ValueError for an invalid mechanism."""
    from dpfed.joint_noise import calibration_from_spec
    return calibration_from_spec(spec)


def expected_noise(spec: pb.RoundSpec) -> dpnoise.NoiseDescription:
    """The NoiseDescription every independent contribution to a joint ``spec`` declares."""
    return calibration(spec).noise()


def decode_release(data: bytes, dim: int, targets: int):
    """A contribution's JointStatistics (strictly decoded), checked to be of the round's
    ``dim`` features and ``targets`` targets, finite; JointRoundError otherwise."""
    from dpfed.joint_statistics import JointStatistics
    try:
        stats = JointStatistics.from_bytes(data)
    except ValueError as exc:
        raise JointRoundError(f"statistics do not decode as a joint release: {exc}") from None
    if stats.dim != dim or stats.targets != targets:
        raise JointRoundError(f"joint statistics of {stats.dim} features and {stats.targets} "
                              f"targets; the round has {dim} features and {targets} targets")
    return stats


class JointRunningTotal(RunningTotal):
    """The exact sum of a joint round's releases: aggregator.aggregate.RunningTotal (same
    thread-safety contract) over the joint vector (``JointStatistics.to_vector``); ``n`` is
    the sum of the contributions' n_x. Counts are summed exactly as the vector's entries
    (integers far below 2^53) and the total is a JointStatistics."""

    error = JointRoundError

    def __init__(self, dim: int, targets: int):
        from dpfed.joint_sensitivity import JointLayout
        self.targets = int(targets)
        super().__init__(dim, JointLayout(int(dim), self.targets, include_n=True).size)

    def _decode(self, data: bytes) -> tuple[np.ndarray, int]:
        """One joint release (checked by ``decode_release``) as its vector and n_x."""
        stats = decode_release(data, self.dim, self.targets)
        return np.asarray(stats.to_vector(), dtype=np.float64), int(stats.n_x)

    def _result(self, values: np.ndarray, n: int, noise):
        """Counts rounded to integers (they are sums of integers: exact)."""
        from dpfed.joint_statistics import JointStatistics
        return JointStatistics.from_vector(self.dim, self.targets, _integral_counts(
            values, self.dim, self.targets), noise=noise)

    def _empty(self) -> "JointRunningTotal":
        return JointRunningTotal(self.dim, self.targets)


def _integral_counts(vector: np.ndarray, d: int, m: int) -> np.ndarray:
    """``vector`` with its count entries (n_x, n_1..m) rounded to integers (from_vector's
    contract: the caller rounds)."""
    from dpfed.joint_sensitivity import JointLayout
    out = np.array(vector, dtype=np.float64)
    sl = JointLayout(d, m, include_n=True).slices()
    for part in ("n_x", "n"):
        out[sl[part]] = np.rint(out[sl[part]])
    return out
