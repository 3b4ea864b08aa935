"""A round's contributions: the releases it accepted (AcceptedContribution), the noise each
must declare (checked when it is admitted: ``round_expected_noise``, ``declared_noise``), the
noise their sum carries (``sum_noise``), and the total with the public statistics (which add
none) that the model is fitted on (``with_public``).

Used by the phases that admit, reload and read contributions (release, recovery, reads) and
by the FITTING phase (aggregator.rounds.fitting); it imports no other part of the round.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from dpfed import noise as dpnoise
from dpfed.sensitivity import expected_noise, row_norm_bound
from dpfed.statistics import Statistics
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import parse_canonical

from aggregator import aggregate, joint_round
from aggregator.contribution_wire import fast_contribution
from aggregator.errors import Rejected


@dataclass
class AcceptedContribution:
    payload: bytes
    signature: bytes
    statistics: bytes      # checked dpfed Statistics encoding; added to the running total
    n: int
    epsilon: float
    received_ms: int
    # The noise it declared (checked equal to the round's expected noise when admitted).
    noise: dpnoise.NoiseDescription | None = None
    # Secure rounds: the masked input (a dpfed.secagg MaskedInput message); statistics is
    # empty and n 0.
    masked: bytes = b""


def round_expected_noise(spec: pb.RoundSpec) -> dpnoise.NoiseDescription:
    """The NoiseDescription every contribution to ``spec`` must declare: one release of the
    spec's mechanism (dpfed.sensitivity.expected_noise; "" = add_remove / exact; the row-norm
    bound R = 1 when the spec's pre-processing normalises rows, ``row_norm_bound``); for a
    joint round, its joint calibration's (aggregator.joint_round.expected_noise). Raises
    ValueError for a spec whose mechanism is invalid (validate_spec refuses those first)."""
    if joint_round.is_joint(spec):
        return joint_round.expected_noise(spec)
    return expected_noise(len(spec.feature_names), spec.epsilon, spec.x_bound, spec.y_bound,
                          tuple(spec.budget_split),
                          neighbouring=spec.neighbouring or "add_remove",
                          xtx_sensitivity=spec.xtx_sensitivity or "exact",
                          x_norm_bound=row_norm_bound(spec.preprocessing.normalize_rows))


@functools.lru_cache(maxsize=64)
def _noise_of(wire: bytes) -> dpnoise.NoiseDescription:
    """The NoiseDescription of a declared noise message's wire bytes; cached (every site of a
    round declares the same few terms, and building one costs ~20 us a contribution). A
    malformed one raises NoiseError, which is not cached."""
    return dpnoise.from_proto(pb.NoiseDescription.FromString(wire))


def declared_noise(c: pb.Contribution, expected: dpnoise.NoiseDescription
                   ) -> dpnoise.NoiseDescription:
    """The noise description ``c`` declares; Rejected if it has none or it is malformed."""
    if not c.HasField("noise"):
        raise Rejected("INVALID_ARGUMENT", "contribution declares no noise description; "
                                           f"round {c.round_id!r} expects "
                                           f"{expected.summary()}")
    try:
        return _noise_of(c.noise.SerializeToString(deterministic=True))
    except dpnoise.NoiseError as exc:
        raise Rejected("INVALID_ARGUMENT", f"invalid noise description: {exc}") from None


def sum_noise(noises) -> dpnoise.NoiseDescription | None:
    """Sum of independent releases' descriptions (K draws for K sites), starting from EXACT
    (public statistics add no noise); None (unknown) if any is unknown."""
    counts: dict[dpnoise.NoiseDescription, int] = {}
    for n in noises:
        if n is None:
            return None
        counts[n] = counts.get(n, 0) + 1
    # Equal descriptions (every site of a round declares the same) summed in one step each:
    # 1000 additions one by one cost 17 ms at the close of a 1000-site round.
    total = dpnoise.EXACT
    for n, k in counts.items():
        total = total + n.repeated(k)
    return total


def stored_contribution(payload: bytes) -> pb.Contribution:
    """The Contribution of a stored envelope's payload (checked when it was admitted)."""
    return fast_contribution(payload) or parse_canonical(payload, "dpfed.v1.Contribution")


def noise_of(c: pb.Contribution) -> dpnoise.NoiseDescription | None:
    """The noise description a stored contribution declared (None if it has none)."""
    return dpnoise.from_proto(c.noise) if c.HasField("noise") else None


def with_public(running: aggregate.RunningTotal, spec: pb.RoundSpec,
                noise: dpnoise.NoiseDescription | None) -> Statistics:
    """``running`` (a copy: it is changed) plus the spec's public statistics, if any, carrying
    ``noise``: the sum of the accepted contributions' descriptions (the public statistics are
    exact and add none). A joint round's public statistics are per target and join each
    target's view at the fit (aggregator.joint_fit): its total is the private JointStatistics
    sum alone."""
    if joint_round.is_joint(spec):
        return running.total(noise=noise)
    if spec.public_statistics:
        running.add_encoded(spec.public_statistics)
    return running.total(noise=noise)
