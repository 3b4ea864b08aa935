"""What a site requires of a secure round (issue 19, item 5): site.toml [policy]
max_noise_threshold (largest T), min_colluders (smallest c) and min_contributors (smallest
max(quorum, T + c), dpfed.secure_round.min_contributors). site_node.policy.check_aggregation
refuses a secure spec outside them with a fixed reason that depends on the spec and the policy
only; every boundary is accepted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dpfed.secure_round import min_contributors
from dpfed.v1 import dpfed_pb2 as pb
from site_node.config import ConfigError, PolicyConfig, load_config
from site_node.policy import PolicyViolation, check_aggregation

SITES = [f"site-{c}" for c in "abcdefgh"]
BASE = PolicyConfig(trusted_coordinators=(Path("unused"),), max_epsilon_per_round=2.0,
                    total_epsilon=5.0)


def policy(**kw) -> PolicyConfig:
    return dataclasses.replace(BASE, **kw)


def secure(t=2, c=0, quorum=2, **kw) -> pb.RoundSpec:
    return pb.RoundSpec(round_id="sec", aggregation="secure", noise_threshold=t, colluders=c,
                        quorum=quorum, max_site_rows=1000, sites=SITES,
                        site_key_ids={s: f"{i:032x}" for i, s in enumerate(SITES)}, **kw)


def refusal(spec, pol) -> str:
    with pytest.raises(PolicyViolation) as info:
        check_aggregation(spec, pol)
    return str(info.value)


def test_defaults_keep_todays_behaviour():
    """Defaults: T <= 1, any c, any number of contributions (a T = 1 round's own share is a
    full draw, as safe as an independent release)."""
    assert (BASE.max_noise_threshold, BASE.min_colluders, BASE.min_contributors) == (1, 0, 1)
    check_aggregation(secure(t=1, c=0, quorum=1), BASE)
    check_aggregation(pb.RoundSpec(round_id="indep"), policy(min_colluders=3,
                                                             min_contributors=8))


def test_max_noise_threshold_refuses_a_larger_T_and_accepts_the_boundary():
    pol = policy(max_noise_threshold=3)
    check_aggregation(secure(t=3, quorum=3), pol)
    reason = refusal(secure(t=4, quorum=4), pol)
    assert reason.startswith("noise threshold T = 4 exceeds this site's "
                             "policy.max_noise_threshold = 3")


def test_min_colluders_refuses_a_smaller_c_and_accepts_the_boundary():
    pol = policy(max_noise_threshold=8, min_colluders=2)
    check_aggregation(secure(t=2, c=2), pol)
    check_aggregation(secure(t=2, c=3), pol)
    assert refusal(secure(t=2, c=1), pol) == (
        "the round tolerates c = 1 colluding site(s), fewer than this site's "
        "policy.min_colluders = 2")
    assert "policy.min_colluders = 2" in refusal(secure(t=2, c=0, quorum=8), pol)


def test_min_contributors_compares_max_of_quorum_and_T_plus_c():
    pol = policy(max_noise_threshold=8, min_contributors=5)
    # At the boundary through each term: T + c = 5, or the quorum = 5.
    for spec in (secure(t=3, c=2, quorum=2), secure(t=5, c=0, quorum=1),
                 secure(t=2, c=0, quorum=5)):
        assert min_contributors(spec) == 5
        check_aggregation(spec, pol)
    below = secure(t=3, c=1, quorum=4)
    assert min_contributors(below) == 4
    assert refusal(below, pol) == (
        "the round may unmask a sum of 4 contribution(s) (max(quorum, T + c)), fewer than "
        "this site's policy.min_contributors = 5")


def test_the_bounds_are_checked_in_order_and_the_reason_depends_on_spec_and_policy_only():
    """T first, then c, then the contributions: one fixed sentence per (spec, policy)."""
    pol = policy(max_noise_threshold=2, min_colluders=1, min_contributors=6)
    assert "max_noise_threshold" in refusal(secure(t=3, c=0, quorum=2), pol)
    assert "min_colluders" in refusal(secure(t=2, c=0, quorum=2), pol)
    assert "min_contributors" in refusal(secure(t=2, c=1, quorum=2), pol)
    check_aggregation(secure(t=2, c=1, quorum=6), pol)
    assert refusal(secure(t=2, c=1, quorum=2), pol) == refusal(secure(t=2, c=1, quorum=2), pol)


def test_a_site_node_refuses_at_consent_with_the_same_reason_whatever_its_data(tmp_path):
    """Two sites with different data and the same policy give byte-identical reasons, and
    nothing is debited."""
    from dpfed.wire.canonical import parse_canonical
    from tests.secure_federation import SecureFed
    fed = SecureFed(tmp_path, 3, rows=50, max_noise_threshold=3,
                    policy_extra={"min_colluders": 1, "min_contributors": 3})
    pins = fed.site_records()

    def consent(site, round_id, **kw):
        spec = fed.spec(round_id, rows=1000, site_key_ids=pins, **kw)
        answer = fed.node(site).consent(fed.coordinator_key.sign(spec))
        return answer.payload_type, parse_canonical(answer.payload, answer.payload_type)

    reasons = set()
    for site in ("site-a", "site-c"):     # 50 and 70 rows
        kind, msg = consent(site, f"low-c-{site}", t=2, colluders=0, quorum=3)
        assert kind == "dpfed.v1.Refusal"
        reasons.add(msg.reason)
        assert fed.node(site).ledger.spent == 0
    assert reasons == {"the round tolerates c = 0 colluding site(s), fewer than this site's "
                       "policy.min_colluders = 1"}
    kind, msg = consent("site-b", "low-k", t=1, colluders=1, quorum=1)
    assert kind == "dpfed.v1.Refusal" and "policy.min_contributors = 3" in msg.reason
    kind, _ = consent("site-b", "ok", t=2, colluders=1, quorum=3)
    assert kind == "dpfed.v1.PhaseMessage"


SITE_TOML = """
site_id = "hospital-a"
aggregator = "127.0.0.1:50051"
state_db = "state.sqlite"
signing_key = "site.key"
insecure = true

[data]
path = "a.csv"

[policy]
trusted_coordinators = ["coord.pub"]
max_epsilon_per_round = 2.0
total_epsilon = 10.0
"""


@pytest.fixture
def site_toml(tmp_path):
    (tmp_path / "site.key").write_text("x")
    (tmp_path / "coord.pub").write_text("x")

    def write(extra: str) -> Path:
        path = tmp_path / "site.toml"
        path.write_text(SITE_TOML + extra)
        return path
    return write


def test_site_toml_reads_the_bounds_with_defaults_and_checks_them(site_toml):
    p = load_config(site_toml("")).policy
    assert (p.max_noise_threshold, p.min_colluders, p.min_contributors) == (1, 0, 1)
    p = load_config(site_toml("max_noise_threshold = 4\nmin_colluders = 1\n"
                              "min_contributors = 5\n")).policy
    assert (p.max_noise_threshold, p.min_colluders, p.min_contributors) == (4, 1, 5)
    for bad, key in (("min_colluders = -1", "policy.min_colluders must be >= 0"),
                     ("min_contributors = 0", "policy.min_contributors must be >= 1"),
                     ("min_colluders = 1.5", "'policy.min_colluders' must be an integer"),
                     ("min_colluder = 1", "did you mean 'policy.min_colluders'"),
                     ("min_contributor = 1", "did you mean 'policy.min_contributors'")):
        with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(".", r"\.")):
            load_config(site_toml(bad + "\n"))
