"""SiteNode.handle_round end to end with real signed specs, and the client against a real
gRPC fake aggregator (Subscribe pushes one spec, Contribute records, first call UNAVAILABLE)."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

from dpfed.statistics import Statistics
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.canonical import digest, parse_canonical
from dpfed.wire.signing import SigningKey, verify
from site_node.client import Backoff, SiteClient
from site_node.config import load_config
from dpfed.noise import from_proto
from dpfed.sensitivity import expected_noise
from site_node.node import SiteNode
from site_node.ledger import LedgerError
from site_node.policy import NOISY_MIN_N_REASON

FEATURES = ["g1", "g2", "g3"]
TARGET = "drug"


def write_site(tmp_path: Path, *, n: int = 200, policy: str = "", data_text: str | None = None,
               aggregator: str = "127.0.0.1:1") -> tuple[Path, SigningKey, SigningKey]:
    """A site folder: keys, a CSV of n rows, and site.toml. Returns (config path, coordinator
    key, site key)."""
    (tmp_path / "keys").mkdir(exist_ok=True)
    coordinator = SigningKey.generate()
    coordinator.save(tmp_path / "keys/coord.key", tmp_path / "keys/coord.pub")
    site_key = SigningKey.generate()
    site_key.save(tmp_path / "keys/site.key", tmp_path / "keys/site.pub")
    if data_text is None:
        rng = np.random.default_rng(0)
        rows = ["id,g1,g2,g3,drug"]
        for i in range(n):
            x = rng.normal(size=3)
            rows.append(f"{i},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x.sum() + rng.normal():.4f}")
        data_text = "\n".join(rows) + "\n"
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data/site.csv").write_text(data_text)
    policy = policy or """
max_epsilon_per_round = 2.0
total_epsilon = 5.0
min_n = 20
"""
    (tmp_path / "site.toml").write_text(f"""
site_id = "hospital-a"
aggregator = "{aggregator}"
state_db = "state/ledger.sqlite"
signing_key = "keys/site.key"
insecure = true

[data]
path = "data/site.csv"
id_column = "id"

[policy]
trusted_coordinators = ["keys/coord.pub"]
{policy}
""")
    return tmp_path / "site.toml", coordinator, site_key


def make_spec(round_id: str = "round-1", **overrides) -> pb.RoundSpec:
    fields = dict(round_id=round_id, coordinator_id="coordinator", target=TARGET,
                  feature_names=FEATURES, epsilon=1.0, x_bound=0.5, y_bound=2.0,
                  # add/remove (the default relation): n gets 15 % (noise scale 6.7 at eps 1,
                  # so 200 rows are never refused for min_n = 20 in these tests).
                  budget_split=[0.30, 0.50, 0.05, 0.15],
                  preprocessing=pb.Preprocessing(x_mean=[0.0, 0.0, 0.0], y_mean=0.0,
                                                 normalize_rows=True),
                  quorum=1, created_unix_ms=int(time.time() * 1000))
    fields.update(overrides)
    return pb.RoundSpec(**fields)


@pytest.fixture
def site(tmp_path):
    config_path, coordinator, site_key = write_site(tmp_path)
    node = SiteNode(load_config(config_path))
    return node, coordinator, site_key


def contribution_of(node, answer, site_key) -> pb.Contribution:
    assert answer.payload_type == "dpfed.v1.Contribution", parse_canonical(
        answer.payload, answer.payload_type).reason
    return verify(answer, {site_key.key_id: site_key.public_key}, "dpfed.v1.Contribution")


def test_handle_round_releases_signed_contribution(site):
    node, coordinator, site_key = site
    envelope = coordinator.sign(make_spec())
    answer = node.handle_round(envelope)
    c = contribution_of(node, answer, site_key)
    assert c.round_id == "round-1" and c.site_id == "hospital-a"
    assert c.epsilon_spent == 1.0
    assert c.spec_digest == digest(envelope.payload)
    assert len(c.nonce) == 32 and int(c.nonce, 16) >= 0
    stats = Statistics.from_bytes(c.statistics)
    assert stats.dim == 3 and stats.n == c.n  # the noisy n, under add/remove
    assert abs(c.n - 200) < 150
    # The declared noise is what the spec implies (the aggregator checks the same).
    assert from_proto(c.noise) == expected_noise(3, 1.0, 0.5, 2.0, (0.30, 0.50, 0.05, 0.15))
    assert from_proto(c.noise).n[0].law == "discrete_laplace"
    assert node.ledger.get_release("round-1").neighbouring == "add_remove"
    assert node.ledger.summary()["releases"][0]["neighbouring"] == "add_remove"
    assert node.ledger.spent == pytest.approx(1.0)
    assert node.ledger.get_release("round-1").envelope.payload == answer.payload


def test_retry_returns_identical_bytes_and_no_second_debit(site):
    node, coordinator, _ = site
    envelope = coordinator.sign(make_spec())
    first = node.handle_round(envelope)
    second = node.handle_round(envelope)
    assert second.SerializeToString() == first.SerializeToString()
    assert node.ledger.spent == pytest.approx(1.0)


def test_retry_after_restart_returns_stored_bytes(tmp_path):
    config_path, coordinator, _ = write_site(tmp_path)
    envelope = coordinator.sign(make_spec())
    first = SiteNode(load_config(config_path)).handle_round(envelope)
    second = SiteNode(load_config(config_path)).handle_round(envelope)
    assert second.payload == first.payload and second.signature == first.signature


def test_same_round_id_different_spec_refused(site):
    node, coordinator, _ = site
    node.handle_round(coordinator.sign(make_spec(epsilon=1.0)))
    answer = node.handle_round(coordinator.sign(make_spec(epsilon=0.5)))
    assert answer.payload_type == "dpfed.v1.Refusal"
    assert "already answered" in parse_canonical(answer.payload, answer.payload_type).reason
    assert node.ledger.spent == pytest.approx(1.0)


def refusal_reason(node, envelope) -> str:
    spent = node.ledger.spent
    answer = node.handle_round(envelope)
    assert answer.payload_type == "dpfed.v1.Refusal"
    refusal = parse_canonical(answer.payload, "dpfed.v1.Refusal")
    assert refusal.site_id == "hospital-a"
    assert refusal.spec_digest == digest(envelope.payload)
    assert node.ledger.spent == spent, "a refusal must debit nothing"
    assert node.ledger.releases() == [] or all(r.round_id != refusal.round_id
                                               for r in node.ledger.releases())
    return refusal.reason


def test_untrusted_coordinator_refused(site):
    node, _, _ = site
    intruder = SigningKey.generate()
    assert "trusted coordinator" in refusal_reason(node, intruder.sign(make_spec()))


def test_bad_signature_refused(site):
    node, coordinator, _ = site
    envelope = coordinator.sign(make_spec())
    envelope.payload = envelope.payload.replace(b'"epsilon":1.0', b'"epsilon":2.0')
    assert "bad signature" in refusal_reason(node, envelope)


def test_epsilon_too_large_refused(site):
    node, coordinator, _ = site
    assert "max_epsilon_per_round" in refusal_reason(node, coordinator.sign(make_spec(epsilon=3.0)))


def test_n_is_exact_under_replace_one_when_the_policy_allows_it(tmp_path):
    config_path, coordinator, site_key = write_site(tmp_path, policy="""
max_epsilon_per_round = 2.0
total_epsilon = 5.0
min_n = 20
allow_replace_one = true
""")
    node = SiteNode(load_config(config_path))
    spec = make_spec(neighbouring="replace_one", xtx_sensitivity="paper",
                     budget_split=[0.35, 0.60, 0.05])
    c = contribution_of(node, node.handle_round(coordinator.sign(spec)), site_key)
    assert c.n == 200 and Statistics.from_bytes(c.statistics).n == 200
    noise = from_proto(c.noise)
    assert noise.n == () and noise == expected_noise(
        3, 1.0, 0.5, 2.0, (0.35, 0.60, 0.05), neighbouring="replace_one", xtx_sensitivity="paper")
    assert node.ledger.get_release("round-1").neighbouring == "replace_one"


def test_replace_one_refused_unless_the_policy_allows_it(site):
    node, coordinator, _ = site
    spec = make_spec(neighbouring="replace_one", budget_split=[0.35, 0.60, 0.05])
    reason = refusal_reason(node, coordinator.sign(spec))
    assert "allow_replace_one" in reason and "n exactly" in reason


@pytest.mark.parametrize("field,value", [("neighbouring", "bounded"),
                                         ("xtx_sensitivity", "tight")])
def test_unknown_relation_or_rule_refused(site, field, value):
    node, coordinator, _ = site
    assert "unknown" in refusal_reason(node, coordinator.sign(make_spec(**{field: value})))


def test_n_below_min_refused_under_replace_one_exactly_and_debits_nothing(tmp_path):
    config_path, coordinator, _ = write_site(tmp_path, n=10, policy="""
max_epsilon_per_round = 2.0
total_epsilon = 5.0
min_n = 20
allow_replace_one = true
""")
    node = SiteNode(load_config(config_path))
    spec = make_spec(neighbouring="replace_one", budget_split=[0.35, 0.60, 0.05])
    assert "min_n" in refusal_reason(node, coordinator.sign(spec))


def test_noisy_n_below_min_refused_after_the_draw_debited_and_stored(tmp_path):
    """Add/remove: the exact n (10) is never compared with min_n; the release is drawn, its
    noisy n (scale 1/(0.15 * 100) = 0.07: 10 with near certainty) is below min_n = 20, so the
    site refuses with a fixed reason, debits the epsilon and stores the refusal; a retry gets
    the same bytes and no fresh noise."""
    config_path, coordinator, _ = write_site(tmp_path, n=10, policy="""
max_epsilon_per_round = 200.0
total_epsilon = 500.0
min_n = 20
""")
    node = SiteNode(load_config(config_path))
    envelope = coordinator.sign(make_spec(epsilon=100.0))
    answer = node.handle_round(envelope)
    assert answer.payload_type == "dpfed.v1.Refusal"
    refusal = parse_canonical(answer.payload, "dpfed.v1.Refusal")
    assert refusal.reason == NOISY_MIN_N_REASON  # fixed text: no count in it
    assert node.ledger.spent == pytest.approx(100.0)
    stored = node.ledger.get_release("round-1")
    assert stored.is_refusal and stored.neighbouring == "add_remove"
    assert node.ledger.unacknowledged() == []  # never resent as a Contribution
    assert node.ledger.summary()["releases"][0]["refused"] is True
    again = node.handle_round(envelope)
    assert again.SerializeToString() == answer.SerializeToString()
    assert node.ledger.spent == pytest.approx(100.0)


def test_target_and_feature_not_allowed_refused(tmp_path):
    config_path, coordinator, _ = write_site(tmp_path, policy="""
max_epsilon_per_round = 2.0
total_epsilon = 5.0
min_n = 20
allowed_targets = ["other_drug"]
allowed_features = ["g1", "g2"]
""")
    node = SiteNode(load_config(config_path))
    assert "allowed_targets" in refusal_reason(node, coordinator.sign(make_spec()))


def test_feature_not_allowed_refused(tmp_path):
    config_path, coordinator, _ = write_site(tmp_path, policy="""
max_epsilon_per_round = 2.0
total_epsilon = 5.0
min_n = 20
allowed_features = ["g1", "g2"]
""")
    node = SiteNode(load_config(config_path))
    assert "allowed_features" in refusal_reason(node, coordinator.sign(make_spec()))


def test_budget_exhaustion_refused(site):
    node, coordinator, _ = site
    for i in range(2):
        assert node.handle_round(coordinator.sign(make_spec(f"r{i}", epsilon=2.0))).payload_type \
            == "dpfed.v1.Contribution"
    assert "budget" in refusal_reason(node, coordinator.sign(make_spec("r2", epsilon=2.0)))
    assert node.ledger.spent == pytest.approx(4.0)


def test_missing_column_refusal_names_column_not_values(site):
    node, coordinator, _ = site
    reason = refusal_reason(node, coordinator.sign(make_spec(feature_names=["g1", "g9", "g3"])))
    assert "g9" in reason


def test_config_total_increase_refused_at_start_until_recorded(tmp_path, capsys):
    """Issue 11, finding 2 (c): raising policy.total_epsilon in site.toml stops the site at
    start (`dpfed site serve` exits 4 saying why) until `dpfed site ledger --raise-total`
    records the raise with who and when; lowering needs nothing."""
    from dpfed import exitcodes
    from dpfed_apps import cli
    config_path, coordinator, _ = write_site(tmp_path)
    node = SiteNode(load_config(config_path))
    node.handle_round(coordinator.sign(make_spec("r0", epsilon=2.0)))
    node.handle_round(coordinator.sign(make_spec("r1", epsilon=2.0)))
    node.ledger.close()
    config_path.write_text(config_path.read_text().replace("total_epsilon = 5.0",
                                                           "total_epsilon = 50.0"))
    with pytest.raises(LedgerError, match="--raise-total"):
        SiteNode(load_config(config_path))
    code = cli.main(["--log-level", "ERROR", "site", "serve", "--config", str(config_path)])
    err = capsys.readouterr().err
    assert code == exitcodes.REFUSED and "never raised silently" in err and "50" in err
    assert cli.main(["site", "ledger", "--raise-total", "--config", str(config_path),
                     "--operator", "dr-ops"]) == exitcodes.OK
    assert cli.main(["site", "ledger", "--config", str(config_path)]) == exitcodes.OK
    out = capsys.readouterr().out
    assert "budget raised: total 5 -> 50 by dr-ops" in out
    node = SiteNode(load_config(config_path))
    assert node.ledger.total_epsilon == 50.0
    assert contribution_of(node, node.handle_round(coordinator.sign(make_spec("r2", epsilon=2.0))),
                           node.signing_key).epsilon_spent == 2.0
    node.ledger.close()
    config_path.write_text(config_path.read_text().replace("total_epsilon = 50.0",
                                                           "total_epsilon = 6.0"))
    node = SiteNode(load_config(config_path))   # lowering: allowed, recorded
    assert node.ledger.total_epsilon == 6.0
    assert "budget" in refusal_reason(node, coordinator.sign(make_spec("r3", epsilon=2.0)))


def test_preprocessing_dimension_mismatch_refused(site):
    node, coordinator, _ = site
    spec = make_spec(preprocessing=pb.Preprocessing(x_mean=[0.0, 0.0], normalize_rows=True))
    assert "feature means" in refusal_reason(node, coordinator.sign(spec))


# -- real gRPC ---------------------------------------------------------------------------

class FakeAggregator(pb_grpc.AggregatorServicer):
    """Pushes one signed spec per Subscribe; fails the first Contribute with UNAVAILABLE."""

    def __init__(self, spec_envelope, fail_first_contribute=True):
        self.spec_envelope = spec_envelope
        self.fail_next = fail_first_contribute
        self.hellos, self.contributions, self.refusals, self.consents = [], [], [], []
        self.contribute_calls = 0
        self.got_contribution = threading.Event()

    def Subscribe(self, request, context):
        self.hellos.append(request)
        yield self.spec_envelope            # consent phase
        while context.is_active() and not self.consents:
            time.sleep(0.02)
        if self.consents:                   # release phase: every consenting site releases
            from dpfed.wire.canonical import canonical_bytes
            notice = pb.PhaseNotice(round_id="r", phase="release",
                                    spec_envelope=self.spec_envelope.SerializeToString(),
                                    participants=[self.consents[0].site_id])
            yield pb.SignedEnvelope(payload=canonical_bytes(notice),
                                    payload_type="dpfed.v1.PhaseNotice")
        while context.is_active() and not self.got_contribution.is_set():
            time.sleep(0.05)
        # End the stream with UNAVAILABLE, as a restarting aggregator would.
        context.abort(grpc.StatusCode.UNAVAILABLE, "aggregator restarting")

    def Contribute(self, request, context):
        self.contribute_calls += 1
        if self.fail_next:
            self.fail_next = False
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        duplicate = any(c.SerializeToString() == request.SerializeToString()
                        for c in self.contributions)
        if not duplicate:
            self.contributions.append(request)
        self.got_contribution.set()
        return pb.ContributeReply(round_id="", accepted=not duplicate, duplicate=duplicate)

    def Refuse(self, request, context):
        self.refusals.append(request)
        return pb.Ack(message="noted")

    def SendPhase(self, request, context):
        from dpfed.wire.canonical import parse_canonical
        self.consents.append(parse_canonical(request.payload, "dpfed.v1.PhaseMessage"))
        return pb.Ack(message="consent recorded")


def start_fake(servicer):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_AggregatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_client_over_grpc_with_retry_after_unavailable(tmp_path):
    config_dir = tmp_path / "site"
    config_dir.mkdir()
    # Bind the fake first to learn its port, then write the config pointing at it.
    servicer = FakeAggregator(None)
    server, port = start_fake(servicer)
    try:
        config_path, coordinator, site_key = write_site(config_dir, aggregator=f"127.0.0.1:{port}")
        spec_envelope = coordinator.sign(make_spec("grpc-round"))
        servicer.spec_envelope = spec_envelope
        node = SiteNode(load_config(config_path))
        client = SiteClient(node, rpc_timeout_s=5, retry_base_s=0.05, retry_cap_s=0.2,
                            reconnect=Backoff(0.05, 0.2))
        thread = threading.Thread(target=client.run, daemon=True)
        thread.start()
        assert servicer.got_contribution.wait(20), "no contribution arrived"
        deadline = time.time() + 10
        while not node.ledger.get_release("grpc-round").acknowledged and time.time() < deadline:
            time.sleep(0.05)
        # The stream is aborted with UNAVAILABLE; the client reconnects with a new hello and
        # is pushed the same spec again: it answers with the stored bytes (a duplicate).
        while len(servicer.hellos) < 2 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        client.stop()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        server.stop(0)

    assert servicer.contribute_calls >= 2  # the first failed with UNAVAILABLE and was retried
    assert len(servicer.contributions) == 1  # later answers were byte-identical duplicates
    c = contribution_of(node, servicer.contributions[0], site_key)
    assert c.round_id == "grpc-round" and c.spec_digest == digest(spec_envelope.payload)
    assert node.ledger.get_release("grpc-round").acknowledged
    assert node.ledger.spent == pytest.approx(1.0)
    assert len(servicer.hellos) >= 2
    hello = verify(servicer.hellos[0], {site_key.key_id: site_key.public_key}, "dpfed.v1.SiteHello")
    assert hello.site_id == "hospital-a" and len(hello.nonce) == 32
    assert servicer.hellos[0].payload != servicer.hellos[1].payload  # fresh nonce per hello


def test_client_resends_unacknowledged_release_on_startup(tmp_path):
    servicer = FakeAggregator(None, fail_first_contribute=False)
    server, port = start_fake(servicer)
    try:
        config_path, coordinator, _ = write_site(tmp_path, aggregator=f"127.0.0.1:{port}")
        node = SiteNode(load_config(config_path))
        # A release stored before a crash, never sent.
        stored = node.handle_round(coordinator.sign(make_spec("old-round")))
        assert not node.ledger.get_release("old-round").sent
        # Subscribe will push a refusable spec (untrusted signer) this time.
        servicer.spec_envelope = SigningKey.generate().sign(make_spec("forged"))
        client = SiteClient(node, rpc_timeout_s=5, reconnect=Backoff(0.05, 0.2))
        thread = threading.Thread(target=client.run, daemon=True)
        thread.start()
        deadline = time.time() + 15
        while (not servicer.refusals or not servicer.contributions) and time.time() < deadline:
            time.sleep(0.05)
        client.stop()
        thread.join(10)
    finally:
        server.stop(0)
    assert servicer.contributions[0].SerializeToString() == stored.SerializeToString()
    assert node.ledger.get_release("old-round").acknowledged
    refusal = parse_canonical(servicer.refusals[0].payload, "dpfed.v1.Refusal")
    assert refusal.round_id == "forged" and "trusted coordinator" in refusal.reason
    assert node.ledger.spent == pytest.approx(1.0)


class RejectingAggregator(FakeAggregator):
    """Answers Contribute with FAILED_PRECONDITION (round closed), as the real one does."""

    def Contribute(self, request, context):
        self.contribute_calls += 1
        self.got_contribution.set()
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "round is closed (DONE)")


def test_rejected_release_is_recorded_not_resent_in_a_loop(tmp_path):
    servicer = RejectingAggregator(None)
    server, port = start_fake(servicer)
    try:
        config_path, coordinator, _ = write_site(tmp_path, aggregator=f"127.0.0.1:{port}")
        node = SiteNode(load_config(config_path))
        node.handle_round(coordinator.sign(make_spec("late")))
        servicer.spec_envelope = coordinator.sign(make_spec("late"))
        servicer.got_contribution.set()  # the fake's stream then ends right after one push
        client = SiteClient(node, rpc_timeout_s=5, reconnect=Backoff(0.05, 0.1))
        thread = threading.Thread(target=client.run, daemon=True)
        thread.start()
        time.sleep(1.5)
        client.stop()
        thread.join(10)
    finally:
        server.stop(0)
    stored = node.ledger.get_release("late")
    assert stored.last_error.startswith("FAILED_PRECONDITION") and not stored.acknowledged
    assert node.ledger.unacknowledged() == []
    assert node.ledger.spent == pytest.approx(1.0)
    # Startup resend tried once; afterwards only the re-pushed spec (stored bytes) is sent.
    assert servicer.contribute_calls <= len(servicer.hellos) + 1


def test_cli_check_and_ledger(tmp_path, capsys):
    from dpfed_apps.cli import main

    config_path, coordinator, _ = write_site(tmp_path)
    assert main(["site", "check", "--config", str(config_path)]) == 0
    assert "nothing was released" in capsys.readouterr().out
    assert main(["site", "ledger", "--config", str(config_path)]) == 1  # no ledger yet
    node = SiteNode(load_config(config_path))
    node.handle_round(coordinator.sign(make_spec("r1", epsilon=1.5)))
    node.ledger.close()
    capsys.readouterr()
    assert main(["site", "ledger", "--config", str(config_path), "--json"]) == 0
    import json
    summary = json.loads(capsys.readouterr().out)
    assert summary["spent_epsilon"] == 1.5 and summary["remaining_epsilon"] == 3.5
    assert [r["round_id"] for r in summary["releases"]] == ["r1"]
    assert summary["releases"][0]["neighbouring"] == "add_remove"
    assert main(["site", "ledger", "--config", str(config_path)]) == 0
    assert "round r1" in (line := [l for l in capsys.readouterr().out.splitlines()
                                   if "round r1" in l][0]) and "add_remove" in line
    bad = tmp_path / "bad.toml"
    bad.write_text("site_id = 1\n")
    assert main(["site", "check", "--config", str(bad)]) == 2


def test_retry_of_the_round_that_exhausted_the_budget_still_gets_stored_bytes(site):
    # The stored-release lookup comes before the budget check: a retry is not a new spend.
    node, coordinator, _ = site
    node.handle_round(coordinator.sign(make_spec("r0", epsilon=2.0)))
    node.handle_round(coordinator.sign(make_spec("r1", epsilon=2.0)))
    last = coordinator.sign(make_spec("r2", epsilon=1.0))
    first = node.handle_round(last)
    assert node.ledger.remaining == pytest.approx(0.0)
    again = node.handle_round(last)
    assert again.payload_type == "dpfed.v1.Contribution"
    assert again.SerializeToString() == first.SerializeToString()


# ---- phases: consent, release notice, re-signing a stale stored release ------------------------


def _notice(spec_envelope, participants, phase="release"):
    from dpfed.wire.canonical import canonical_bytes
    notice = pb.PhaseNotice(round_id="round-1", phase=phase,
                            spec_envelope=spec_envelope.SerializeToString(),
                            participants=participants)
    return pb.SignedEnvelope(payload=canonical_bytes(notice), payload_type="dpfed.v1.PhaseNotice")


def test_consent_draws_nothing_and_debits_nothing(site):
    node, coordinator, site_key = site
    envelope = coordinator.sign(make_spec())
    answer = node.consent(envelope)
    consent = verify(answer, {site_key.key_id: site_key.public_key}, "dpfed.v1.PhaseMessage")
    assert consent.phase == "consent" and consent.round_id == "round-1"
    assert consent.spec_digest == digest(envelope.payload) and not consent.body
    assert node.ledger.spent == 0 and node.ledger.releases() == []
    # A spec beyond the policy is refused at consent, still for free.
    refused = node.consent(coordinator.sign(make_spec("round-2", epsilon=50.0)))
    assert refused.payload_type == "dpfed.v1.Refusal"
    assert parse_canonical(refused.payload, "dpfed.v1.Refusal").epsilon_spent == 0
    assert node.ledger.spent == 0


def test_release_notice_releases_once_and_only_for_participants(site):
    node, coordinator, site_key = site
    envelope = coordinator.sign(make_spec())
    assert node.handle_notice(_notice(envelope, ["hospital-b"])) is None
    assert node.handle_notice(_notice(envelope, ["hospital-a"], phase="unmask")) is None
    garbage = pb.SignedEnvelope(payload=b"{", payload_type="dpfed.v1.PhaseNotice")
    assert node.handle_notice(garbage) is None
    assert node.ledger.spent == 0
    first = node.handle_notice(_notice(envelope, ["hospital-a", "hospital-b"]))
    contribution_of(node, first, site_key)
    again = node.handle_notice(_notice(envelope, ["hospital-a", "hospital-b"]))
    assert again.SerializeToString() == first.SerializeToString()
    assert node.ledger.spent == pytest.approx(1.0)
    # A forged spec inside a notice is refused like a forged spec.
    from dpfed.wire.signing import SigningKey
    forged = SigningKey.generate().sign(make_spec("round-3"))
    answer = node.handle_notice(_notice(forged, ["hospital-a"]))
    assert answer.payload_type == "dpfed.v1.Refusal"
    assert node.ledger.spent == pytest.approx(1.0)


def test_a_stale_stored_release_is_resigned_over_the_same_statistics(site, monkeypatch):
    from site_node import node as node_module
    node, coordinator, site_key = site
    envelope = coordinator.sign(make_spec())
    first = contribution_of(node, node.handle_round(envelope), site_key)
    release = node.ledger.get_release("round-1")
    assert node.fresh_envelope(release).payload == release.envelope.payload   # still fresh
    later = node_module.now_ms() + node_module.RESIGN_AFTER_MS + 1000
    monkeypatch.setattr(node_module, "now_ms", lambda: later)
    resent = node.handle_round(envelope)
    c = contribution_of(node, resent, site_key)
    assert c.statistics == first.statistics and c.n == first.n
    assert c.noise == first.noise and c.epsilon_spent == first.epsilon_spent
    assert c.timestamp_unix_ms == later and c.nonce != first.nonce
    assert node.ledger.get_release("round-1").envelope.payload == resent.payload
    assert node.ledger.spent == pytest.approx(1.0)


def test_the_ledger_never_replaces_a_release_with_other_statistics(site):
    from site_node.ledger import LedgerError
    node, coordinator, site_key = site
    envelope = coordinator.sign(make_spec())
    first = contribution_of(node, node.handle_round(envelope), site_key)
    other = pb.Contribution()
    other.CopyFrom(first)
    other.statistics = first.statistics[:-8] + bytes(8)
    with pytest.raises(LedgerError):
        node.ledger.replace_envelope("round-1", site_key.sign(other))
    assert node.ledger.get_release("round-1").envelope.payload == node.handle_round(envelope).payload
