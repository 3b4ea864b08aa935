"""The aggregator's plain functions: exact aggregation, spec validation, the fast
contribution decoder (must accept exactly what the reference parser accepts) and the store."""

from __future__ import annotations

import base64
import binascii
import json
import math
import random
import secrets

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator import aggregate
from aggregator.contribution_wire import fast_contribution as _fast_contribution
from aggregator.store import RoundStore, StoredContribution, StoredRound
from dpfed.statistics import Statistics, StatisticsError
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import CanonicalError, canonical_bytes, parse_canonical

from tests.conftest import public_statistics, random_statistics


def test_exact_sum_is_order_independent_and_correctly_rounded():
    parts = [random_statistics(d=4, seed=i, n=10 + i) for i in range(30)]
    parts.append(Statistics(np.eye(4) * 1e16, np.full(4, 1e16), 1e16, 1))  # cancellation
    parts.append(Statistics(np.eye(4) * -1e16, np.full(4, -1e16), -1e16, 1))
    total = aggregate.exact_sum(parts)
    shuffled = parts[:]
    random.Random(1).shuffle(shuffled)
    assert aggregate.exact_sum(shuffled) == total
    assert aggregate.aggregate_encoded([p.to_bytes() for p in shuffled], None) == total
    assert total.yty == math.fsum(p.yty for p in parts)
    assert total.n == sum(p.n for p in parts)
    public = random_statistics(d=4, seed=99)
    assert aggregate.aggregate(parts, public) == aggregate.exact_sum(parts + [public])


def test_encoded_n_agrees_with_statistics_decoder():
    s = random_statistics(d=5, n=77)
    assert aggregate.encoded_n(s.to_bytes(), 5) == 77
    bad = [s.to_bytes()[:-1], b"XXXX" + s.to_bytes()[4:],
           s.to_bytes()[:-8] + np.array([np.inf]).astype("<f8").tobytes()]
    for data in bad:
        with pytest.raises(StatisticsError):
            Statistics.from_bytes(data)
        with pytest.raises(StatisticsError):
            aggregate.encoded_n(data, 5)
    with pytest.raises(StatisticsError):
        aggregate.encoded_n(s.to_bytes(), 4)


def _contribution(**kw):
    fields = dict(round_id="r", site_id="s", statistics=random_statistics().to_bytes(), n=50,
                  epsilon_spent=2.0, spec_digest="ab" * 32, timestamp_unix_ms=1_700_000_000_000,
                  nonce=secrets.token_hex(16))
    fields.update(kw)
    return pb.Contribution(**fields)


def _noise_proto(replace_one=False):
    from dpfed.noise import to_proto
    from dpfed.sensitivity import expected_noise
    if replace_one:
        return to_proto(expected_noise(3, 1.0, 0.5, 2.0, (0.35, 0.6, 0.05),
                                       neighbouring="replace_one", xtx_sensitivity="paper"))
    return to_proto(expected_noise(3, 1.0, 0.5, 2.0) + expected_noise(3, 2.0, 0.5, 2.0))


@pytest.mark.parametrize("message", [
    _contribution(), _contribution(epsilon_spent=0.1 + 0.2), _contribution(n=0),
    _contribution(statistics=b""), _contribution(site_id="é\"\\x"), _contribution(epsilon_spent=1e300),
    _contribution(timestamp_unix_ms=-5), _contribution(statistics=b"\xff\xfe"),
    pb.Contribution(),
    _contribution(noise=_noise_proto()), _contribution(noise=pb.NoiseDescription()),
    _contribution(noise=_noise_proto(replace_one=True))])
def test_fast_contribution_decoder_matches_reference(message):
    data = canonical_bytes(message)
    assert _fast_contribution(data) == parse_canonical(data, "dpfed.v1.Contribution")


_TEXT = st.text(alphabet=st.sampled_from('ab"\\:,{}= \u00e9\x00static'), max_size=20)


@settings(max_examples=300, deadline=None)
@given(round_id=_TEXT, site_id=_TEXT, nonce=_TEXT, statistics=st.binary(max_size=40),
       n=st.integers(0, 2**64 - 1))
def test_fast_contribution_decoder_matches_reference_on_any_fields(round_id, site_id, nonce,
                                                                   statistics, n):
    """Text fields full of quotes, backslashes and pieces of '"statistics":"' cannot move
    the cut the decoder makes around the base64 statistics."""
    message = _contribution(round_id=round_id, site_id=site_id, nonce=nonce,
                            statistics=statistics, n=n)
    data = canonical_bytes(message)
    assert _fast_contribution(data) == parse_canonical(data, "dpfed.v1.Contribution")


@pytest.mark.parametrize("payload", [
    b'{"round_id":"\\"statistics\\":\\"QQ==","statistics":"QQ=="}',
    b'{"round_id":"r","statistics":"QQ==","statistics":"QQ=="}',
    b'{"round_id":"r","statistics":""}',
    b'{"round_id":"r","statistics":"QQ==}',
    b'{"round_id":"r","statistics":"Q\\u0051=="}',
    b'{"round_id":"r","statistics":"QQ==" }',
])
def test_fast_contribution_decoder_rejects_tricks_around_the_statistics(payload):
    assert _fast_contribution(payload) is None or (
        _fast_contribution(payload) == parse_canonical(payload, "dpfed.v1.Contribution"))
    try:
        parse_canonical(payload, "dpfed.v1.Contribution")
    except CanonicalError:
        assert _fast_contribution(payload) is None


@pytest.mark.parametrize("mutate", [
    lambda b: b.replace(b'"n":"50"', b'"n":50'),
    lambda b: b.replace(b",", b", ", 1),
    lambda b: b.replace(b'"epsilon_spent":2.0', b'"epsilon_spent":2'),
    lambda b: b.replace(b'"round_id":"r"', b'"round_id":"r","extra":1'),
    lambda b: b.replace(b"=", b"", 1),
    lambda b: b.replace(b'"nonce"', b'"nonce":"x","nonce"'),
])
def test_fast_contribution_decoder_rejects_what_reference_rejects(mutate):
    message = _contribution(statistics=b"\x01\x02\x03\x04")  # base64 with padding
    bad = mutate(canonical_bytes(message))
    assert bad != canonical_bytes(message)
    assert _fast_contribution(bad) is None
    with pytest.raises(CanonicalError):
        parse_canonical(bad, "dpfed.v1.Contribution")


def _spec(**kw):
    fields = dict(round_id="r", coordinator_id="c", target="y", feature_names=["a", "b"],
                  epsilon=1.0, x_bound=1.0, y_bound=1.0, budget_split=[0.35, 0.6, 0.03, 0.02],
                  quorum=2, deadline_unix_ms=1)
    fields.update(kw)
    return pb.RoundSpec(**fields)


def test_validate_spec():
    sites = ["a", "b", "c"]
    assert aggregate.validate_spec(_spec(), sites) == []
    assert aggregate.validate_spec(_spec(public_statistics=public_statistics(d=2).to_bytes()), sites) == []
    for bad in [_spec(epsilon=-1), _spec(x_bound=0), _spec(quorum=4), _spec(quorum=2, sites=["a"]),
                _spec(feature_names=[]), _spec(budget_split=[0.2, 0.2, 0.2]),
                _spec(public_statistics=b"junk"), _spec(fit_method="magic"),
                _spec(public_statistics=random_statistics(d=3).to_bytes()),
                _spec(public_statistics=random_statistics(d=2).to_bytes()),  # not realisable
                _spec(budget_split=[0.35, 0.6, 0.05]),  # 3 shares under add/remove
                _spec(neighbouring="replace_one"),      # 4 shares under replace-one
                _spec(neighbouring="bounded"), _spec(xtx_sensitivity="tight")]:
        assert aggregate.validate_spec(bad, sites), bad
    # The relation decides the number of shares; "" means add/remove, exact.
    assert aggregate.validate_spec(_spec(neighbouring="replace_one", xtx_sensitivity="paper",
                                         budget_split=[0.35, 0.6, 0.05]), sites) == []
    assert aggregate.validate_spec(_spec(neighbouring="add_remove", xtx_sensitivity="exact"),
                                   sites) == []
    problems = aggregate.validate_spec(_spec(neighbouring="bounded"), sites)
    assert any("neighbouring must be one of add_remove, replace_one" in p for p in problems)


def contribution_envelope(round_id: str, site_id: str, statistics: bytes, n: int = 10) -> bytes:
    """A stored contribution envelope as the aggregator keeps it (the signature is not
    checked by the store)."""
    c = pb.Contribution(round_id=round_id, site_id=site_id, statistics=statistics, n=n,
                        epsilon_spent=1.0, nonce=f"n-{site_id}")
    return pb.SignedEnvelope(payload=canonical_bytes(c), signature=b"s" * 64, key_id="k",
                             payload_type="dpfed.v1.Contribution").SerializeToString()


def stored_contribution_of(round_id: str, site_id: str, seed: int = 0) -> StoredContribution:
    stats = random_statistics(d=3, seed=seed).to_bytes()
    return StoredContribution(round_id, site_id, contribution_envelope(round_id, site_id, stats),
                              stats, 10, 1.0, 7)


def test_store_round_trip(tmp_path):
    store = RoundStore(tmp_path / "s.sqlite")
    r = StoredRound("r1", b"env", "dig", 3, 2, 123, ["a", "b"], "OPEN", "", 5, 0.0, 0.0)
    store.insert_round(r)
    c = stored_contribution_of("r1", "a")
    store.insert_contribution(c, "key", "nonce", 6)
    with pytest.raises(Exception):  # the nonce is unique
        store.insert_contribution(stored_contribution_of("r1", "b", 1), "key", "nonce", 6)
    store.set_state("r1", "FITTING", "quorum", round_s=1.5)
    store.close()
    store = RoundStore(tmp_path / "s.sqlite")
    (back,) = store.rounds()
    assert (back.state, back.message, back.round_s, back.invited) == ("FITTING", "quorum", 1.5, ["a", "b"])
    assert store.contributions("r1") == [c]  # the failed second insert left nothing
    assert store.nonces_since(0) == [("key", "nonce")]
    store.close()


def test_store_keeps_a_contributions_statistics_once(tmp_path):
    """The statistics are written once, inside the envelope, and read back out of it; a
    store of version 0 (a copy beside the envelope) is still read, from its copy; an envelope
    that does not decode is an error, not a contribution without statistics; a store of a
    newer version is refused."""
    import sqlite3
    path = tmp_path / "s.sqlite"
    store = RoundStore(path)
    c = stored_contribution_of("r1", "a")
    store.insert_contribution(c, "key", "nonce", 6)
    store.close()
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT statistics FROM contributions").fetchall() == [(b"",)]
    assert raw.execute("PRAGMA user_version").fetchone() == (1,)
    # What an aggregator before version 1 wrote: the copy beside the envelope.
    old = stored_contribution_of("r1", "b", 1)
    raw.execute("INSERT INTO contributions VALUES (?,?,?,?,?,?,?)",
                ("r1", "b", old.envelope, old.statistics, old.n, old.epsilon, old.received_ms))
    raw.execute("PRAGMA user_version = 0")
    raw.commit()
    raw.close()
    store = RoundStore(path)
    assert store.contributions("r1") == [c, old]
    assert store.contributions("r1")[0].statistics == c.statistics
    store.close()
    raw = sqlite3.connect(path)
    raw.execute("INSERT INTO contributions VALUES ('r2','a',?,?,1,1.0,1)", (b"\x0a\x05junk", b""))
    raw.commit()
    raw.close()
    store = RoundStore(path)
    with pytest.raises(Exception):
        store.contributions("r2")
    store.close()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    with pytest.raises(RuntimeError, match="version 2"):
        RoundStore(path)



def test_store_fsyncs_every_commit(tmp_path):
    """synchronous=FULL in WAL mode: an acknowledged contribution survives a power loss, not
    only a process crash (the site never resends what was acknowledged)."""
    store = RoundStore(tmp_path / "s.sqlite")
    assert store._query("PRAGMA journal_mode") == [("wal",)]
    assert store._query("PRAGMA synchronous") == [(2,)]   # 2 = FULL
    store.close()


_B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n"


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=40).map(base64.b64encode),
                 st.text(alphabet=_B64_CHARS, max_size=24).map(str.encode)))
def test_canonical_base64_decoder_accepts_exactly_what_b64encode_produces(raw):
    from aggregator.contribution_wire import canonical_b64decode as _canonical_b64decode
    try:
        reference = base64.b64decode(raw, validate=True)
        canonical = base64.b64encode(reference) == raw
    except binascii.Error:
        canonical = False
    assert _canonical_b64decode(raw) == (reference if canonical else None)


@pytest.mark.parametrize("raw", [b"QR==", b"QUJDRB==", b"QUF=", b"QQ", b"QQ=", b"QQ===",
                                 b"QQ==QQ==", b"Q-==", b"QUJD\n", b"=QQ="])
def test_canonical_base64_decoder_rejects_non_canonical_forms(raw):
    from aggregator.contribution_wire import canonical_b64decode as _canonical_b64decode
    assert _canonical_b64decode(raw) is None


def test_fast_contribution_decoder_takes_the_fast_path_with_a_noise_description():
    data = canonical_bytes(_contribution(noise=_noise_proto()))
    fast = _fast_contribution(data)
    assert fast is not None and fast.HasField("noise")
    assert fast == parse_canonical(data, "dpfed.v1.Contribution")
