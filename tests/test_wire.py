"""Canonical encoding, signatures and the generated code."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.canonical import CanonicalError, canonical_bytes, digest, parse_canonical
from dpfed.wire.signing import SignatureError, SigningKey, load_public_key, verify

ROOT = Path(__file__).resolve().parent.parent


def _contribution(**kw):
    fields = dict(round_id="r1", site_id="site-a", statistics=b"\x00\x01binary\xff", n=12,
                  epsilon_spent=0.1 + 0.2, spec_digest="ab" * 32, timestamp_unix_ms=1_700_000_000_123,
                  nonce="00" * 16)
    fields.update(kw)
    return pb.Contribution(**fields)


def test_canonical_round_trip_is_exact():
    c = _contribution()
    data = canonical_bytes(c)
    back = parse_canonical(data, "dpfed.v1.Contribution")
    assert back == c
    assert back.epsilon_spent == 0.1 + 0.2  # shortest repr round-trips doubles exactly
    assert canonical_bytes(back) == data


@pytest.mark.parametrize("mutate", [
    lambda b: b.replace(b",", b", ", 1),                       # whitespace
    lambda b: b'{"site_id":"site-a",' + b[1:].replace(b'"site_id":"site-a",', b""),  # key order
    lambda b: b.replace(b'"n":"12"', b'"n":12'),              # int64 as a JSON number
    lambda b: b[:-1],                                           # truncated
    lambda b: b"\xff" + b,                                      # not UTF-8
])
def test_non_canonical_payloads_are_rejected(mutate):
    data = canonical_bytes(_contribution())
    bad = mutate(data)
    assert bad != data
    with pytest.raises(CanonicalError):
        parse_canonical(bad, "dpfed.v1.Contribution")


def test_signature_verifies_and_detects_tampering(tmp_path):
    key = SigningKey.generate()
    key.save(tmp_path / "k.key", tmp_path / "k.pub")
    loaded = SigningKey.load(tmp_path / "k.key")
    trusted = {key.key_id: load_public_key(tmp_path / "k.pub")}
    env = loaded.sign(_contribution())
    assert verify(env, trusted, "dpfed.v1.Contribution") == _contribution()
    tampered = pb.SignedEnvelope()
    tampered.CopyFrom(env)
    tampered.payload = env.payload.replace(b'"n":"12"', b'"n":"13"')
    with pytest.raises(SignatureError):
        verify(tampered, trusted, "dpfed.v1.Contribution")
    with pytest.raises(SignatureError):  # domain separation: not valid as another type
        verify(env, trusted, "dpfed.v1.Refusal")
    with pytest.raises(SignatureError):
        verify(env, {}, "dpfed.v1.Contribution")
    assert len(digest(env.payload)) == 64


def test_generated_code_is_not_stale(tmp_path):
    pytest.importorskip("grpc_tools")
    import importlib.util
    spec = importlib.util.spec_from_file_location("generate", ROOT / "protos" / "generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    produced = gen.generate(tmp_path)
    assert produced
    for path in produced:
        rel = path.relative_to(tmp_path)
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is not committed"
        assert filecmp.cmp(path, committed, shallow=False), (
            f"{rel} is stale: run python protos/generate.py")


def test_signatures_of_the_wrong_length_or_key_or_type_are_refused():
    from dpfed.wire import signing
    key, other = SigningKey.generate(), SigningKey.generate()
    env = key.sign(pb.Contribution(round_id="r", site_id="s", statistics=b"\x01" * 1000, n=3))
    signing.verify_signature(env, key.public_key, "dpfed.v1.Contribution")
    forged = [
        pb.SignedEnvelope(payload=env.payload + b" ", signature=env.signature, key_id=env.key_id),
        pb.SignedEnvelope(payload=env.payload, signature=env.signature[:-1] + bytes(
            [env.signature[-1] ^ 1]), key_id=env.key_id),
        pb.SignedEnvelope(payload=env.payload, signature=env.signature[:63], key_id=env.key_id),
        pb.SignedEnvelope(payload=env.payload, signature=b"", key_id=env.key_id),
        pb.SignedEnvelope(payload=env.payload, signature=env.signature + b"\x00",
                          key_id=env.key_id),
    ]
    for bad in forged:
        with pytest.raises(SignatureError):
            signing.verify_signature(bad, key.public_key, "dpfed.v1.Contribution")
    with pytest.raises(SignatureError):
        signing.verify_signature(env, other.public_key, "dpfed.v1.Contribution")
    with pytest.raises(SignatureError):  # the domain prefix binds the payload type
        signing.verify_signature(env, key.public_key, "dpfed.v1.Refusal")


def _reference_parse(data: bytes, cls):
    """parse_canonical as it was before its fast path: json_format, then the re-encoding
    check. The message, or None if refused."""
    from google.protobuf import json_format
    try:
        message = json_format.Parse(data.decode("utf-8"), cls())
    except (UnicodeDecodeError, json_format.ParseError, ValueError):
        return None
    return message if canonical_bytes(message) == data else None


_CONSENT = (b'{"nonce":"c9f05f4e","phase":"consent","round_id":"r-1","site_id":"site-0000",'
            b'"spec_digest":"00ff","timestamp_unix_ms":"1795779412005"}')


@pytest.mark.parametrize("data", [
    _CONSENT,
    _CONSENT.replace(b'"1795779412005"', b"1795779412005"),           # a number, not a string
    _CONSENT.replace(b'"1795779412005"', b'"01795779412005"'),        # leading zero
    _CONSENT.replace(b'"1795779412005"', b'"+1795779412005"'),
    _CONSENT.replace(b'"1795779412005"', b'"1_795779412005"'),
    _CONSENT.replace(b'"1795779412005"', b'" 1795779412005"'),
    _CONSENT.replace(b'"1795779412005"', b'"-1795779412005"'),         # negative: canonical
    _CONSENT.replace(b'"1795779412005"', b'"9223372036854775807"'),    # int64 max
    _CONSENT.replace(b'"1795779412005"', b'"9223372036854775808"'),    # past it
    _CONSENT.replace(b'"1795779412005"', b'"0"'),                      # a default, written
    _CONSENT.replace(b'"1795779412005"', b'"1e3"'),
    _CONSENT.replace(b'"site-0000"', b'""'),                           # a default, written
    _CONSENT.replace(b'"site-0000"', '"sit\u00e9"'.encode()),          # UTF-8, canonical
    _CONSENT.replace(b'"site-0000"', b'"sit\\u00e9"'),                 # escaped: not
    _CONSENT.replace(b'"site-0000"', b'"\\ud800"'),                    # lone surrogate
    _CONSENT.replace(b'"site-0000"', b'"a\\"b\\\\c\\n"'),              # escapes JSON keeps
    _CONSENT.replace(b'"site-0000"', b'null'),
    _CONSENT.replace(b'"site-0000"', b'["x"]'),
    _CONSENT.replace(b'"site-0000"', b'{"a":"b"}'),
    _CONSENT.replace(b'"site-0000"', b"7"),
    _CONSENT.replace(b'"site_id"', b'"siteId"'),                       # JSON name, not proto's
    _CONSENT.replace(b'"round_id":"r-1",', b''),
    _CONSENT.replace(b'"round_id":"r-1",', b'"round_id":"r-1","round_id":"r-2",'),
    _CONSENT.replace(b'"nonce":"c9f05f4e",', b'"round_id":"r-0","nonce":"c9f05f4e",'),
    _CONSENT.replace(b'"phase":"consent",', b'"phase":"consent","zz":"1",'),
    _CONSENT.replace(b'"phase":"consent",', b'"body":"AAE=","phase":"consent",'),  # bytes
    _CONSENT.replace(b",", b", "),
    _CONSENT + b" ",
    b" " + _CONSENT,
    b"{}", b"[]", b'"x"', b"", b"\xff", b"{" * 5000,
])
def test_fast_flat_parse_agrees_with_json_format(data):
    """parse_canonical decodes flat messages (strings and 64-bit integers only) without
    json_format; it must accept exactly what the reference accepts, with the same message."""
    for cls, name in ((pb.PhaseMessage, "dpfed.v1.PhaseMessage"),
                      (pb.SiteHello, "dpfed.v1.SiteHello")):
        expected = _reference_parse(data, cls)
        try:
            got = parse_canonical(data, name)
        except CanonicalError:
            got = None
        assert got == expected
        if got is not None:
            assert canonical_bytes(got) == data


def test_a_consent_takes_the_fast_path():
    from dpfed.wire.canonical import _flat_message
    assert _flat_message(_CONSENT, pb.PhaseMessage) == _reference_parse(_CONSENT, pb.PhaseMessage)
    assert _flat_message(_CONSENT.replace(b'"phase":"consent",', b'"body":"AAE=","phase":"consent",'),
                         pb.PhaseMessage) is None
