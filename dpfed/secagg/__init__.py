"""Secure aggregation with distributed discrete Laplace noise (method.md section 10, issue 10).

The pure, transport-free core: K sites add fixed-point statistics plus a 1/T share of one
discrete Laplace draw, masked so that the aggregator learns only the sum (Bonawitz et al., CCS
2017) over a sparse neighbour graph for many sites (Bell et al., CCS 2020). One concept per
module:

- ``fixedpoint``: real statistics <-> integers mod 2^64, the scale and the grid sensitivity;
- ``exact``: a site's exact statistics (quantised rows, integer sums), encoded with one
  rounding and no floating-point error term;
- ``dlaplace``: the distributed discrete Laplace law, its CSPRNG sampler and the noise facts of
  a sum (``dpfed.noise`` terms);
- ``calibration``: the per-part grid calibration a round derives from public numbers
  (``calibrate`` -> ``GridCalibration.release_exact`` at sites, ``decode``/``check_sum``/
  ``noise_description`` at the aggregator);
- ``csprng``: uniforms and normals from os.urandom;
- ``keys``: per-round X25519 key pairs, HKDF key agreement, identity signatures;
- ``masks``: ChaCha20 mask expansion and the masked input;
- ``shamir``: t-of-n Shamir sharing of 32-byte secrets;
- ``graph``: the SecAgg+ neighbour graph and its degree/threshold choice;
- ``codec``, ``messages``: canonical bytes of every protocol message;
- ``protocol``: ``RoundConfig``, ``SiteSession``, ``AggregatorSession``;
- ``simulate``: an in-memory driver of a whole round;
- ``errors``: the typed refusals.

Imports: numpy, cryptography, the standard library and ``dpfed.noise`` only (no gRPC, no roles,
no numpy random generators). docs/secure_aggregation.md describes the design and its tests.
"""

from dpfed.secagg.errors import (AbortedRound, ForgedMessage, MalformedMessage, OutOfPhase,
                                 ParameterError, ReconstructionError, ReplayedMessage,
                                 SecAggError, TooFewSurvivors, UnknownSender, UnsafeRequest,
                                 WrongRound)
from dpfed.secagg.messages import Phase
from dpfed.secagg.protocol import (AggregateResult, AggregatorSession, RoundConfig,
                                   SiteSession)

__all__ = ["RoundConfig", "SiteSession", "AggregatorSession", "AggregateResult", "Phase",
           "SecAggError", "ParameterError", "MalformedMessage", "ForgedMessage",
           "ReplayedMessage", "WrongRound", "OutOfPhase", "UnknownSender", "TooFewSurvivors",
           "UnsafeRequest", "ReconstructionError", "AbortedRound"]
