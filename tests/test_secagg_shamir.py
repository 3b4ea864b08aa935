"""dpfed.secagg.shamir: any t shares reconstruct, t - 1 reveal nothing, bad input is refused."""

import itertools
import random
import secrets

import pytest

from dpfed.secagg import shamir
from dpfed.secagg.errors import MalformedMessage, ParameterError, ReconstructionError


def test_any_t_shares_reconstruct():
    secret = secrets.token_bytes(32)
    t, idx = 3, [1, 4, 5, 9, 12]
    shares = shamir.split(secret, t, idx)
    for subset in itertools.combinations(shares, t):
        assert shamir.reconstruct(subset, t) == secret
    assert shamir.reconstruct(shares, t) == secret            # extra shares are checked
    assert shamir.reconstruct(random.sample(shares, 4), t, max_index=12) == secret


def test_t_minus_one_shares_reveal_nothing_useful():
    secret = secrets.token_bytes(32)
    t = 4
    shares = shamir.split(secret, t, range(1, 8))
    few = shares[:t - 1]
    with pytest.raises(ReconstructionError, match="threshold"):
        shamir.reconstruct(few, t)
    # interpolating t - 1 points gives a wrong value ...
    guess = shamir.interpolate_at_zero([(s.index, s.value) for s in few])
    assert guess != int.from_bytes(secret, "big")
    # ... and every candidate secret is consistent with them: the polynomial through
    # (0, candidate) and the t - 1 shares exists, so the shares carry no information.
    for candidate in (0, 1, int.from_bytes(secrets.token_bytes(32), "big")):
        pts = [(0, candidate)] + [(s.index, s.value) for s in few]
        assert shamir._evaluate(pts, 0) == candidate
        assert all(shamir._evaluate(pts, s.index) == s.value for s in few)


def test_duplicates_out_of_range_and_inconsistent_shares_are_refused():
    secret = secrets.token_bytes(32)
    shares = shamir.split(secret, 2, [1, 2, 3])
    with pytest.raises(ReconstructionError, match="duplicate"):
        shamir.reconstruct([shares[0], shares[0]], 2)
    with pytest.raises(ReconstructionError, match="above"):
        shamir.reconstruct(shares, 2, max_index=2)
    bad = shamir.Share(3, (shares[2].value + 1) % shamir.PRIME)
    with pytest.raises(ReconstructionError, match="inconsistent"):
        shamir.reconstruct([shares[0], shares[1], bad], 2)
    # a wrong share among exactly t gives a value outside 32 bytes (probability 1 - 2^-265)
    with pytest.raises(ReconstructionError, match="32-byte"):
        shamir.reconstruct([shares[0], bad], 2)
    with pytest.raises(ParameterError):
        shamir.split(secret, 2, [1, 1, 2])
    with pytest.raises(ParameterError):
        shamir.split(secret, 4, [1, 2, 3])
    with pytest.raises(ParameterError):
        shamir.split(secret, 2, [0, 1])
    with pytest.raises(MalformedMessage):
        shamir.Share(0, 5)


def test_share_bytes_round_trip():
    s = shamir.split(secrets.token_bytes(32), 2, [7, 8])[0]
    assert shamir.Share.from_bytes(s.to_bytes()) == s
    with pytest.raises(MalformedMessage):
        shamir.Share.from_bytes(s.to_bytes() + b"\x00")
