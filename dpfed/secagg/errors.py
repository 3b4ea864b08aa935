"""Typed errors of the secure-aggregation core (``dpfed.secagg``).

Every refusal of the state machines (``dpfed.secagg.protocol``) and of the message codec
(``dpfed.secagg.messages``) raises a subclass of ``SecAggError``, so a transport layer can map
them to one status code and a log line without parsing text. Nothing is revealed, released or
changed in a session's state when one of these is raised for a received message: the message is
dropped and the session stays where it was (except ``AbortedRound``, which is final).
"""

from __future__ import annotations

__all__ = ["SecAggError", "ParameterError", "MalformedMessage", "ForgedMessage",
           "ReplayedMessage", "WrongRound", "OutOfPhase", "UnknownSender", "TooFewSurvivors",
           "UnsafeRequest", "ReconstructionError", "AbortedRound", "SumOutOfRange"]


class SecAggError(Exception):
    """Base class of every refusal of the secure-aggregation core."""


class ParameterError(SecAggError, ValueError):
    """Public parameters that cannot work: overflow of 2^64, thresholds out of range, a graph
    that cannot be built, a noise scale the sampler cannot serve."""


class MalformedMessage(SecAggError):
    """Bytes that do not parse as the expected message, or fields out of range."""


class ForgedMessage(SecAggError):
    """A signature or an authentication tag that does not verify, or a message whose signed
    content contradicts what the session already knows (a substituted key, a share addressed
    to somebody else)."""


class ReplayedMessage(SecAggError):
    """A second message from the same sender in the same phase."""


class WrongRound(ReplayedMessage):
    """A message bound to another round id or to another round configuration (a replay from a
    previous round, or a configuration the aggregator showed to somebody else)."""


class OutOfPhase(SecAggError):
    """A message of a phase that is not the session's current phase."""


class UnknownSender(SecAggError):
    """A message from (or addressed to, or about) a site that is not in the round, or not in
    the set of sites still taking part at that phase."""


class TooFewSurvivors(SecAggError):
    """Fewer sites than the round's threshold remain: unmasking would reveal too much (or the
    distributed noise would be incomplete), so nothing is unmasked and no output is produced."""


class UnsafeRequest(SecAggError):
    """An unmasking request that would make a site reveal something it must never reveal: both
    the self-mask seed and the mask key of one site, shares for a site that it knows sent its
    input, or a second answer in the same round."""


class ReconstructionError(SecAggError):
    """Shamir shares that are too few, duplicated, out of range or inconsistent, or a
    reconstructed secret that does not match its public commitment."""


class AbortedRound(SecAggError):
    """The session has failed before and refuses to do anything further."""


class SumOutOfRange(SecAggError):
    """An unmasked sum that cannot be the sum of the round's statistics: its decoded n is
    beyond what the fixed-point grid holds without wrapping (more rows than the round's public
    row bound allows for), or an entry is beyond its bound given that n. The sum is not
    used (``dpfed.secagg.calibration.GridCalibration.check_sum``)."""
