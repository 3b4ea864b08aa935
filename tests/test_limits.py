"""dpfed.wire.limits: the same limits at both ends. Boundaries (d = 512 passes, 513 does not),
identifier and nonce formats, clipping of outgoing text, and both ends applying them: the
aggregator rejects with INVALID_ARGUMENT and keeps its state, the site refuses without debit."""

from __future__ import annotations

import secrets
import time

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire import limits
from site_node.config import load_config
from site_node.node import SiteNode
from tests.test_site_node import make_spec, write_site


def _spec(d=3, **kw):
    now = int(time.time() * 1000)
    fields = dict(round_id="r-1", coordinator_id="coord", target="y",
                  feature_names=[f"x{i}" for i in range(d)], epsilon=1.0, x_bound=1.0,
                  y_bound=1.0, budget_split=[0.35, 0.6, 0.03, 0.02], quorum=1,
                  deadline_unix_ms=now + 60_000, created_unix_ms=now)
    fields.update(kw)
    return pb.RoundSpec(**fields)


def test_feature_count_boundary():
    assert limits.spec_problems(_spec(d=limits.MAX_FEATURES)) == []
    assert any("features" in p for p in limits.spec_problems(_spec(d=limits.MAX_FEATURES + 1)))


@pytest.mark.parametrize("field,value", [
    ("round_id", ""), ("round_id", "a" * 129), ("round_id", "r 1"), ("round_id", "-r"),
    ("round_id", "r\n1"), ("coordinator_id", "é"), ("target", "y\x00"),
    ("feature_names", ["x0", ""]), ("feature_names", ["x" * 257]), ("sites", ["ok", "no way"]),
    ("epsilon", float("nan")), ("epsilon", 1e9), ("x_bound", float("inf")),
    ("fit_draws", 10**6), ("public_source", "p" * 2000), ("public_statistics", b"\x00" * 10),
    ("budget_split", [0.2] * 5), ("deadline_unix_ms", 2**62),
    ("neighbouring", "n" * 300), ("xtx_sensitivity", "exact\n")])
def test_spec_field_outside_limits(field, value):
    spec = _spec()
    if isinstance(value, list):
        getattr(spec, field)[:] = value
    else:
        setattr(spec, field, value)
    assert limits.spec_problems(spec), field


def test_gdsc_style_feature_names_are_allowed():
    spec = _spec(feature_names=["loss:cnaPANCAN1 (CDKN2A,CDKN2B)", "TP53_mut", "gain:x (a; b)"])
    assert limits.spec_problems(spec) == []


@pytest.mark.parametrize("nonce", ["", "A" * 32, "g" * 32, "a" * 31, "a" * 33, "0x" + "a" * 30])
def test_nonce_format(nonce):
    c = pb.Contribution(round_id="r", site_id="s", statistics=b"x", n=1, spec_digest="a" * 64,
                        nonce=nonce)
    with pytest.raises(limits.LimitError, match="nonce"):
        limits.check_contribution(c)


def test_contribution_n_bounds():
    c = pb.Contribution(round_id="r", site_id="s", n=0, spec_digest="a" * 64,
                        nonce=secrets.token_hex(16))
    with pytest.raises(limits.LimitError, match="n = 0"):
        limits.check_contribution(c)
    c.n = limits.MAX_N + 1
    with pytest.raises(limits.LimitError):
        limits.check_contribution(c)


@settings(max_examples=200)
@given(st.text())
def test_clipped_text_always_fits(text):
    clipped = limits.clip_text(text)
    assert limits._text(clipped, "t", limits.MAX_REASON_CHARS) is None


@settings(max_examples=200)
@given(st.text(max_size=300))
def test_clip_id_gives_a_valid_id_or_nothing(value):
    out = limits.clip_id(value)
    assert out == "" or (out == value and limits._id(out, "id") is None)


def test_envelope_size_limits():
    env = pb.SignedEnvelope(payload=b"x" * (limits.MAX_PAYLOAD_BYTES + 1), signature=b"s" * 65,
                            key_id="k" * 33, payload_type="t" * 65)
    assert len(limits.envelope_problems(env)) == 4


def test_aggregator_rejects_oversized_spec_and_keeps_no_round(federation):
    spec = federation.spec("big", d=limits.MAX_FEATURES + 1)
    with pytest.raises(grpc.RpcError) as err:
        federation.start_round(spec)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "513 features" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        federation.coordinator.status("big")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_aggregator_rejects_overlong_query_with_a_short_message(federation):
    with pytest.raises(grpc.RpcError) as err:
        federation.coordinator.status("r" * 100_000)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(err.value.details()) < 2000


def test_site_refuses_oversized_spec_without_debit(tmp_path):
    config_path, coordinator, _ = write_site(tmp_path)
    node = SiteNode(load_config(config_path))
    d = limits.MAX_FEATURES + 1
    spec = make_spec(feature_names=[f"g{i}" for i in range(d)],
                     preprocessing=pb.Preprocessing(x_mean=[0.0] * d))
    answer = node.handle_round(coordinator.sign(spec))
    assert answer.payload_type == "dpfed.v1.Refusal"
    assert node.ledger.spent == 0 and node.ledger.releases() == []


def test_contribution_noise_description_limits():
    c = pb.Contribution(round_id="r", site_id="s", statistics=b"x", n=1, spec_digest="a" * 64,
                        nonce="a" * 32, epsilon_spent=1.0)
    limits.check_contribution(c)
    for _ in range(limits.MAX_NOISE_TERMS + 1):
        c.noise.xty.add(law="laplace", scale=1.0, draws=1)
    with pytest.raises(limits.LimitError, match="noise.xty"):
        limits.check_contribution(c)
    c.noise.ClearField("xty")
    c.noise.n.add(law="l" * 1000, scale=1.0, draws=1)
    with pytest.raises(limits.LimitError, match="noise.n"):
        limits.check_contribution(c)
