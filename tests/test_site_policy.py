"""Policy checks as pure functions: signature first, then every public parameter."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.wire.signing import SigningKey
from site_node.config import PolicyConfig
from site_node.policy import PolicyViolation, check_n, check_spec, verify_spec
from tests.test_site_node import make_spec

POLICY = PolicyConfig(trusted_coordinators=(Path("unused"),), max_epsilon_per_round=2.0,
                      total_epsilon=5.0, min_n=20, allowed_targets=("drug",),
                      allowed_features=("*",))
COORD = SigningKey.generate()
TRUSTED = {COORD.key_id: COORD.public_key}


def check(spec, spent=0.0, total=5.0, policy=POLICY, **kw):
    check_spec(spec, policy, site_id="hospital-a", spent=spent, total=total, **kw)


def test_valid_spec_passes():
    spec = verify_spec(COORD.sign(make_spec()), TRUSTED)
    check(spec)


def test_signature_checked_first():
    with pytest.raises(PolicyViolation, match="unknown signing key"):
        verify_spec(SigningKey.generate().sign(make_spec()), TRUSTED)
    env = COORD.sign(make_spec())
    env.signature = bytes(64)
    with pytest.raises(PolicyViolation, match="bad signature"):
        verify_spec(env, TRUSTED)
    wrong_type = COORD.sign(pb.SiteHello(site_id="x"))
    with pytest.raises(PolicyViolation, match="expected a dpfed.v1.RoundSpec"):
        verify_spec(wrong_type, TRUSTED)


@pytest.mark.parametrize("overrides,match", [
    (dict(epsilon=2.5), "max_epsilon_per_round"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(x_bound=0.0), "x_bound"),
    (dict(y_bound=-1.0), "y_bound"),
    (dict(budget_split=[0.5, 0.5, 0.5, 0.5]), "sum to 1"),
    (dict(budget_split=[0.5, 0.5]), "4 numbers"),
    (dict(budget_split=[0.35, 0.60, 0.05]), "4 numbers"),   # 3 shares under add/remove
    (dict(budget_split=[]), "4 numbers"),
    (dict(neighbouring="bounded"), "unknown neighbouring"),
    (dict(xtx_sensitivity="tight"), "unknown xtx_sensitivity"),
    (dict(neighbouring="replace_one", budget_split=[0.35, 0.60, 0.05]), "allow_replace_one"),
    (dict(target="other"), "allowed_targets"),
    (dict(target=""), "no target"),
    (dict(feature_names=[]), "no features"),
    (dict(feature_names=["g1", "g1", "g2"]), "repeats"),
    (dict(feature_names=["g1", "g2", "drug"]), "also a feature"),
    (dict(preprocessing=pb.Preprocessing(x_mean=[0.0])), "feature means"),
    (dict(sites=["hospital-b"]), "not invited"),
    (dict(round_id=""), "round_id"),
])
def test_violations(overrides, match):
    with pytest.raises(PolicyViolation, match=match):
        check(make_spec(**overrides))


def test_replace_one_needs_the_policy_opt_in_and_three_shares():
    policy = PolicyConfig(**{**POLICY.__dict__, "allow_replace_one": True})
    check(make_spec(neighbouring="replace_one", budget_split=[0.35, 0.60, 0.05]), policy=policy)
    with pytest.raises(PolicyViolation, match="3 numbers"):
        check(make_spec(neighbouring="replace_one"), policy=policy)  # 4 shares
    # Empty strings are the defaults: add/remove, exact.
    check(make_spec(neighbouring="", xtx_sensitivity=""))
    check(make_spec(neighbouring="add_remove", xtx_sensitivity="paper"))
    assert POLICY.allow_replace_one is False  # the default


def test_budget():
    check(make_spec(epsilon=1.0), spent=4.0)
    with pytest.raises(PolicyViolation, match="budget exhausted"):
        check(make_spec(epsilon=1.0), spent=4.5)


def test_feature_allow_list():
    policy = PolicyConfig(**{**POLICY.__dict__, "allowed_features": ("g1", "g2")})
    with pytest.raises(PolicyViolation, match="g3"):
        check(make_spec(), policy=policy)


def test_deadline():
    spec = make_spec(deadline_unix_ms=1000)
    with pytest.raises(PolicyViolation, match="deadline"):
        check(spec, now_ms=2000)


def test_min_n():
    check_n(20, POLICY)
    with pytest.raises(PolicyViolation, match="min_n"):
        check_n(19, POLICY)
