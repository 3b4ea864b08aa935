"""Mutual TLS over real gRPC on 127.0.0.1 with certificates from dpfed_apps.ca.

What is checked: a whole round over mTLS (aggregator, a site node, a coordinator); the handshake
turns away clients without a certificate, with one from another CA, or in plaintext; and the
aggregator binds each signed message to the certificate's identity (aggregator/identity.py), so
a party holding someone else's signing key cannot use it over its own connection.
"""

from __future__ import annotations

import json
import secrets
import shutil
import threading
import time
import tomllib

import grpc
import numpy as np
import pytest

from aggregator import identity
from aggregator.config import config_from_dict
from aggregator.server import AggregatorServer
from coordinator.client import Coordinator
from dpfed import exitcodes
from dpfed_apps.ca import kit_dir, kit_tls, project_from_dict, provision
from dpfed.statistics import Statistics
from dpfed.transport import client_channel
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.signing import SigningKey
from tests.test_site_node import make_spec

SITES = ("site-a", "site-b")
COORDINATORS = ("coord", "other-coord")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two federations: ours, and a rogue one with the same party names and its own CA."""
    root = tmp_path_factory.mktemp("pki")
    for name in ("ours", "rogue"):
        provision(project_from_dict({
            "federation": name, "sites": list(SITES), "coordinators": list(COORDINATORS),
            "aggregator": {"address": "127.0.0.1:50051"}}), root / name)
    return root / "ours", root / "rogue"


def tls_of(out, kind, name):
    return kit_tls(kit_dir(out, kind, name), name)


def signing_key(out, kind, name) -> SigningKey:
    return SigningKey.load(kit_dir(out, kind, name) / "keys" / f"{name}.key")


@pytest.fixture
def aggregator(pki, tmp_path):
    """The aggregator of the kit's own aggregator.toml, on a free port, state in tmp_path."""
    ours, _ = pki
    kit = kit_dir(ours, "aggregator", "aggregator")
    raw = tomllib.loads((kit / "aggregator.toml").read_text())
    assert "insecure" not in raw
    raw.update(listen="127.0.0.1:0", state_db=str(tmp_path / "agg.sqlite"), grace_s=0.2)
    server = AggregatorServer(config_from_dict(raw, kit))
    port = server.start()
    yield server, f"127.0.0.1:{port}"
    server.stop(0)


def coordinator_over(pki_out, address, tls_name, key_name="coord") -> Coordinator:
    return Coordinator(address, signing_key(pki_out, "coordinator", key_name), key_name,
                       tls_of(pki_out, "coordinator", tls_name), timeout_s=10)


def start_round(pki, address, round_id, quorum=1, *, sites=(), consent=True, refusing=()):
    """Start a round for ``sites`` (default every site). With ``consent`` each invited site
    consents over its own TLS identity (those in ``refusing`` refuse instead), so the round is
    in its release phase on return; without, real site nodes answer."""
    ours, _ = pki
    with coordinator_over(ours, address, "coord") as c:
        status = c.start_round(make_spec(round_id, coordinator_id="coord", quorum=quorum,
                                         sites=list(sites),
                                         deadline_unix_ms=int(time.time() * 1000) + 60_000,
                                         fit_method="laplace", fit_draws=200, fit_seed=1))
    if consent:
        for site_id in (sites or SITES):
            key = signing_key(ours, "site", site_id)
            fields = dict(round_id=round_id, site_id=site_id, spec_digest=status.spec_digest,
                          nonce=secrets.token_hex(16), timestamp_unix_ms=int(time.time() * 1000))
            with client_channel(address, tls_of(ours, "site", site_id)) as ch:
                stub = pb_grpc.AggregatorStub(ch)
                if site_id in refusing:
                    stub.Refuse(key.sign(pb.Refusal(reason="not this round", **fields)), timeout=5)
                else:
                    stub.SendPhase(key.sign(pb.PhaseMessage(phase="consent", **fields)), timeout=5)
    return status


def site_contribution(key: SigningKey, site_id: str, round_id: str, digest: str) -> pb.SignedEnvelope:
    rng = np.random.default_rng(1)
    a = rng.normal(size=(3, 3))
    stats = Statistics(a @ a.T, rng.normal(size=3), 40.0, 50)
    from aggregator.rounds import round_expected_noise
    from dpfed.noise import to_proto
    return key.sign(pb.Contribution(
        round_id=round_id, site_id=site_id, statistics=stats.to_bytes(), n=50, epsilon_spent=1.0,
        spec_digest=digest, timestamp_unix_ms=int(time.time() * 1000),
        nonce=secrets.token_hex(16), noise=to_proto(round_expected_noise(make_spec(round_id)))))


def rpc_code(fn) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code()


# ---- a round end to end ------------------------------------------------------------------------


def _site_kit_with_data(ours, tmp_path, address):
    """A copy of site-a's kit as its hospital would fill it in: data file, aggregator port."""
    kit = tmp_path / "site-a"
    shutil.copytree(kit_dir(ours, "site", "site-a"), kit)
    rng = np.random.default_rng(0)
    rows = ["id,g1,g2,g3,drug"]
    for i in range(200):  # far above min_n: the noisy n (add/remove) is never refused
        x = rng.normal(size=3)
        rows.append(f"{i},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x.sum() + rng.normal():.4f}")
    (kit / "data").mkdir()
    (kit / "data" / "CHANGE-ME.csv").write_text("\n".join(rows) + "\n")
    config = kit / "site.toml"
    config.write_text(config.read_text().replace('"127.0.0.1:50051"', f'"{address}"'))
    return config


def test_round_end_to_end_over_mutual_tls(pki, aggregator, tmp_path):
    from site_node.client import Backoff, SiteClient
    from site_node.config import load_config
    from site_node.node import SiteNode

    ours, _ = pki
    server, address = aggregator
    config = load_config(_site_kit_with_data(ours, tmp_path, address))
    assert config.tls is not None and config.tls.cert.name == "site-a.pem"
    node = SiteNode(config)
    client = SiteClient(node, rpc_timeout_s=5, reconnect=Backoff(0.05, 0.2))
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    try:
        with coordinator_over(ours, address, "coord") as coordinator:
            deadline = time.monotonic() + 20
            while not any(s.connected for s in coordinator.list_sites() if s.site_id == "site-a"):
                assert time.monotonic() < deadline, "site-a never connected over TLS"
                time.sleep(0.05)
            start_round(pki, address, "tls-round", sites=["site-a"], consent=False)
            status = coordinator.wait("tls-round", 60, poll_s=0.05)
            assert status.state == pb.RoundStatus.DONE, status.message
            # n is the site's noisy n (add/remove): the one its ledger recorded.
            assert [(c.site_id, c.n) for c in status.contributions] == [
                ("site-a", node.ledger.get_release("tls-round").n)]
            assert abs(status.contributions[0].n - 200) < 150
            result = coordinator.result("tls-round")
            assert result.dim == 3
    finally:
        client.stop()
        thread.join(10)
        node.ledger.close()
    from site_node.ledger import PrivacyLedger
    with PrivacyLedger(config.state_db) as ledger:
        assert ledger.spent == pytest.approx(1.0)


# ---- the handshake ----------------------------------------------------------------------------


def test_client_without_certificate_is_rejected_at_handshake(pki, aggregator):
    ours, _ = pki
    _, address = aggregator
    ca = (ours / "ca" / "ca.pem").read_bytes()
    with grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca)) as ch:
        code = rpc_code(lambda: pb_grpc.AggregatorStub(ch).ListSites(pb.ListSitesRequest(),
                                                                      timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_is_rejected(aggregator):
    _, address = aggregator
    with grpc.insecure_channel(address) as ch:
        code = rpc_code(lambda: pb_grpc.AggregatorStub(ch).ListSites(pb.ListSitesRequest(),
                                                                      timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE


def test_certificate_from_another_ca_is_rejected(pki, aggregator):
    ours, rogue = pki
    _, address = aggregator
    # The rogue site-a: same name, same kind of certificate, another CA.
    with client_channel(address, tls_of(rogue, "site", "site-a")) as ch:
        code = rpc_code(lambda: pb_grpc.AggregatorStub(ch).ListSites(pb.ListSitesRequest(),
                                                                      timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE
    # Control: with our site-a certificate the handshake succeeds and the aggregator judges
    # the call itself (sites may not list the federation: PERMISSION_DENIED, an answer).
    with client_channel(address, tls_of(ours, "site", "site-a")) as ch:
        code = rpc_code(lambda: pb_grpc.AggregatorStub(ch).ListSites(pb.ListSitesRequest(),
                                                                      timeout=5))
    assert code == grpc.StatusCode.PERMISSION_DENIED


# ---- identity binding -------------------------------------------------------------------------


def test_site_b_signing_as_site_a_is_denied_and_the_sum_untouched(pki, aggregator):
    ours, _ = pki
    server, address = aggregator
    digest = start_round(pki, address, "r-bind", quorum=2).spec_digest
    stolen = signing_key(ours, "site", "site-a")
    envelope = site_contribution(stolen, "site-a", "r-bind", digest)
    with client_channel(address, tls_of(ours, "site", "site-b")) as ch:
        stub = pb_grpc.AggregatorStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Contribute(envelope, timeout=5)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "site-b" in info.value.details()
        refusal = stolen.sign(pb.Refusal(round_id="r-bind", site_id="site-a", reason="x",
                                         spec_digest=digest, nonce=secrets.token_hex(16),
                                         timestamp_unix_ms=int(time.time() * 1000)))
        assert rpc_code(lambda: stub.Refuse(refusal, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        hello = stolen.sign(pb.SiteHello(site_id="site-a", nonce=secrets.token_hex(16),
                                         timestamp_unix_ms=int(time.time() * 1000)))
        assert rpc_code(lambda: next(stub.Subscribe(hello, timeout=5))) == \
            grpc.StatusCode.PERMISSION_DENIED
    with client_channel(address, tls_of(ours, "coordinator", "coord")) as ch:
        # A coordinator certificate cannot carry a site's message either.
        code = rpc_code(lambda: pb_grpc.AggregatorStub(ch).Contribute(envelope, timeout=5))
        assert code == grpc.StatusCode.PERMISSION_DENIED
    status = server.manager.status("r-bind")
    assert not status.contributions and not status.refusals
    assert server.store.contributions("r-bind") == []
    assert server.manager.aggregated_statistics("r-bind") == Statistics.zeros(3)
    # Control: the very same envelope over site-a's own connection is accepted.
    with client_channel(address, tls_of(ours, "site", "site-a")) as ch:
        reply = pb_grpc.AggregatorStub(ch).Contribute(envelope, timeout=5)
    assert reply.accepted and [c.site_id for c in server.store.contributions("r-bind")] == ["site-a"]


def test_coordinator_identity_mismatch_is_denied(pki, aggregator):
    ours, _ = pki
    server, address = aggregator
    spec = make_spec("r-coord", coordinator_id="coord",
                     deadline_unix_ms=int(time.time() * 1000) + 60_000)
    # coord's signing key over other-coord's certificate, and over a site's certificate.
    with coordinator_over(ours, address, "other-coord", key_name="coord") as c:
        assert rpc_code(lambda: c.start_round(spec)) == grpc.StatusCode.PERMISSION_DENIED
    site_tls = Coordinator(address, signing_key(ours, "coordinator", "coord"), "coord",
                           tls_of(ours, "site", "site-a"), timeout_s=10)
    with site_tls as c:
        assert rpc_code(lambda: c.start_round(spec)) == grpc.StatusCode.PERMISSION_DENIED
    from aggregator.rounds import Rejected
    with pytest.raises(Rejected):
        server.manager.status("r-coord")   # no round was created
    with coordinator_over(ours, address, "coord") as c:
        assert c.start_round(spec).state == pb.RoundStatus.CONSENT


# ---- who may read ------------------------------------------------------------------------------


def _reads(stub, round_id):
    """The three read-only RPCs, as (name, call)."""
    query = pb.RoundQuery(round_id=round_id)
    return [("GetRound", lambda: stub.GetRound(query, timeout=5)),
            ("GetResult", lambda: stub.GetResult(query, timeout=5)),
            ("ListSites", lambda: stub.ListSites(pb.ListSitesRequest(), timeout=5))]


def test_read_only_rpcs_are_for_coordinators_only(pki, aggregator):
    """aggregator/identity.py READERS: coordinators read everything; a site (even one invited
    to the round, even of a finished round) reads nothing."""
    ours, _ = pki
    server, address = aggregator
    digest = start_round(pki, address, "r-read", quorum=1, refusing=("site-b",)).spec_digest
    with client_channel(address, tls_of(ours, "site", "site-a")) as ch:
        assert pb_grpc.AggregatorStub(ch).Contribute(
            site_contribution(signing_key(ours, "site", "site-a"), "site-a", "r-read", digest),
            timeout=5).accepted
    end = time.monotonic() + 30
    while server.manager.status("r-read").state != pb.RoundStatus.DONE:
        assert time.monotonic() < end, server.manager.status("r-read").message
        time.sleep(0.05)
    for name in SITES:                 # site-a took part, site-b was invited
        with client_channel(address, tls_of(ours, "site", name)) as ch:
            for rpc, call in _reads(pb_grpc.AggregatorStub(ch), "r-read"):
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, rpc)
                assert rpc in info.value.details() and "r-read" not in info.value.details()
    # The aggregator's certificate is for serving only (no client-auth purpose): the
    # handshake already refuses it.
    with client_channel(address, tls_of(ours, "aggregator", "aggregator")) as ch:
        for rpc, call in _reads(pb_grpc.AggregatorStub(ch), "r-read"):
            assert rpc_code(call) == grpc.StatusCode.UNAVAILABLE, rpc
    for name in COORDINATORS:          # any registered coordinator, not only the round's
        with client_channel(address, tls_of(ours, "coordinator", name)) as ch:
            stub = pb_grpc.AggregatorStub(ch)
            answers = {rpc: call() for rpc, call in _reads(stub, "r-read") if rpc != "GetResult"}
            if name == "coord":
                answers["GetResult"] = stub.GetResult(pb.RoundQuery(round_id="r-read"), timeout=5)
            else:
                # site-a never declared whom it trusts (no SiteHello here): only the round's
                # own coordinator sees its entries and the result (aggregator/budget.py).
                assert rpc_code(lambda: stub.GetResult(pb.RoundQuery(round_id="r-read"),
                                                       timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        assert answers["GetRound"].state == pb.RoundStatus.DONE
        assert [bool(c.hidden) for c in answers["GetRound"].contributions] == [name != "coord"]
        assert name != "coord" or answers["GetResult"].round_id == "r-read"
        assert {s.site_id for s in answers["ListSites"].sites} == set(SITES)


def test_untrusted_coordinator_sees_a_sites_n_and_reasons_redacted(pki, aggregator, tmp_path):
    """Issue 11, finding 5: site-a trusts only `coord` (its SiteHello declares the key ids of
    policy.trusted_coordinators). Over mutual TLS `coord` sees site-a's n, epsilon, refusal
    reason, result row and listing; `other-coord` sees site-a's id only, each entry saying
    why, and no result of a round site-a contributed to."""
    import re

    from site_node.client import Backoff, SiteClient
    from site_node.config import load_config
    from site_node.node import SiteNode

    ours, _ = pki
    server, address = aggregator
    config_path = _site_kit_with_data(ours, tmp_path, address)
    config_path.write_text(re.sub(r"trusted_coordinators = \[.*\]",
                                  'trusted_coordinators = ["keys/coord.pub"]',
                                  config_path.read_text()))
    node = SiteNode(load_config(config_path))
    client = SiteClient(node, rpc_timeout_s=5, reconnect=Backoff(0.05, 0.2))
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    try:
        with coordinator_over(ours, address, "coord") as coord, \
                coordinator_over(ours, address, "other-coord", key_name="other-coord") as other:
            deadline = time.monotonic() + 20
            while not any(s.connected for s in coord.list_sites() if s.site_id == "site-a"):
                assert time.monotonic() < deadline, "site-a never connected over TLS"
                time.sleep(0.05)
            start_round(pki, address, "r-trusted", sites=["site-a"], consent=False)
            assert coord.wait("r-trusted", 30, poll_s=0.05).state == pb.RoundStatus.DONE
            other.start_round(make_spec("r-other", coordinator_id="other-coord", quorum=1,
                                        deadline_unix_ms=int(time.time() * 1000) + 60_000))
            while not server.manager.status("r-other").refusals:
                assert time.monotonic() < deadline + 30, "site-a never refused r-other"
                time.sleep(0.05)

            # The other one: site-a's n, epsilon, time, reason and listing are hidden.
            theirs = other.status("r-trusted").contributions[0]
            assert theirs.site_id == "site-a" and (theirs.n, theirs.epsilon_spent,
                                                   theirs.received_unix_ms) == (0, 0.0, 0)
            refusal = other.status("r-other").refusals[0]   # even in its own round
            assert refusal.site_id == "site-a" and refusal.reason == "" and refusal.hidden
            assert "does not trust coordinator 'other-coord'" in theirs.hidden
            with pytest.raises(grpc.RpcError) as info:
                other.result("r-trusted")
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "site-a" in info.value.details()
            listed = {s.site_id: s for s in other.list_sites()}["site-a"]
            assert listed.hidden and not listed.key_id and not listed.connected
            assert listed.spent_epsilon == 0.0 and listed.last_seen_unix_ms == 0

            # The trusted coordinator sees everything of site-a.
            mine = coord.status("r-trusted").contributions[0]
            assert (mine.site_id, mine.hidden, mine.epsilon_spent) == ("site-a", "", 1.0)
            assert mine.n == node.ledger.get_release("r-trusted").n > 0
            refusal = coord.status("r-other").refusals[0]
            assert refusal.site_id == "site-a" and not refusal.hidden and "coordinator" in refusal.reason
            rows = json.loads(coord.result("r-trusted").summary_json)["sites"]
            assert rows == [{"site_id": "site-a", "n": mine.n, "epsilon": 1.0}]
            listed = {s.site_id: s for s in coord.list_sites()}["site-a"]
            assert listed.connected and listed.key_id and not listed.hidden
            assert listed.spent_epsilon == 1.0 and listed.declared_total_epsilon == node.ledger.total_epsilon
    finally:
        client.stop()
        thread.join(10)
        node.ledger.close()


def test_read_denied_rules():
    from dpfed_apps.ca import AGGREGATOR
    assert identity.read_denied(None, "GetRound") is None           # plaintext server
    for rpc in identity.READERS:
        assert identity.read_denied(identity.PeerIdentity("coordinator", "c"), rpc) is None
        for kind in ("site", AGGREGATOR):
            assert rpc in identity.read_denied(identity.PeerIdentity(kind, "x"), rpc)


# ---- identity extraction (no network) ---------------------------------------------------------


def test_identity_from_auth_context(pki):
    ours, _ = pki
    ssl = {"transport_security_type": [b"ssl"]}
    assert identity.identity_from_auth_context({}) is None      # plaintext
    peer = identity.identity_from_auth_context(
        {**ssl, "x509_subject_alternative_name": [b"localhost", b"dpfed://site/site-a"]})
    assert peer == identity.PeerIdentity("site", "site-a") and str(peer) == "dpfed://site/site-a"
    with pytest.raises(identity.NoPeerIdentity):
        identity.identity_from_auth_context({**ssl, "x509_subject_alternative_name": [b"x.org"]})
    with pytest.raises(identity.NoPeerIdentity):
        identity.identity_from_auth_context({**ssl, "x509_subject_alternative_name": [
            b"dpfed://site/site-a", b"dpfed://coordinator/coord"]})
    pem = (ours / "public" / "coordinators" / "coord.pem").read_bytes()
    assert identity.identity_from_auth_context({**ssl, "x509_pem_cert": [pem]}) == \
        identity.PeerIdentity("coordinator", "coord")
    assert identity.site_mismatch(None, "site-a") is None       # plaintext server: no binding
    assert identity.site_mismatch(identity.PeerIdentity("coordinator", "site-a"), "site-a")
    assert identity.coordinator_mismatch(identity.PeerIdentity("site", "coord"), "coord")


# ---- commands refuse to run without TLS -------------------------------------------------------


def _run_cli(argv, capsys):
    from dpfed_apps import cli
    code = cli.main(["--log-level", "ERROR", *argv])
    return code, capsys.readouterr().err


def test_commands_without_tls_config_exit_2_and_say_how_to_provision(pki, tmp_path, capsys):
    ours, _ = pki
    kit = kit_dir(ours, "aggregator", "aggregator")
    agg = tmp_path / "aggregator.toml"
    agg.write_text((kit / "aggregator.toml").read_text().split("[tls]")[0].replace(
        "keys/", f"{kit}/keys/") + "\n[[sites]]\nsite_id = \"site-a\"\n"
        f"public_key = \"{kit}/keys/site-a.pub\"\n")
    code, err = _run_cli(["aggregator", "serve", "--config", str(agg)], capsys)
    assert code == exitcodes.USAGE and "dpfed provision" in err and "--insecure" in err

    site_kit = kit_dir(ours, "site", "site-a")
    site = tmp_path / "site.toml"
    text = (site_kit / "site.toml").read_text()
    head, tail = text.split("[tls]")
    site.write_text((head + "[data]" + tail.split("[data]")[1]).replace(
        '"keys/', f'"{site_kit}/keys/'))
    code, err = _run_cli(["site", "serve", "--config", str(site)], capsys)
    assert code == exitcodes.USAGE and "dpfed provision" in err and "--insecure" in err

    code, err = _run_cli(["sites", "list", "--aggregator", "127.0.0.1:1"], capsys)
    assert code == exitcodes.USAGE and "dpfed provision" in err
    spec = tmp_path / "round.toml"
    spec.write_text('target = "drug"\nfeatures = ["g1"]\nepsilon = 1.0\nx_bound = 0.5\n'
                    'y_bound = 2.0\nquorum = 1\n')
    code, err = _run_cli(["round", "start", "--spec", str(spec), "--aggregator", "127.0.0.1:1",
                          "--key", str(kit_dir(ours, "coordinator", "coord") / "keys/coord.key"),
                          "--coordinator-id", "coord"], capsys)
    assert code == exitcodes.USAGE and "dpfed provision" in err


def test_insecure_flag_warns_and_plaintext_cannot_reach_a_tls_aggregator(aggregator, capsys):
    _, address = aggregator
    code, err = _run_cli(["sites", "list", "--aggregator", address, "--insecure"], capsys)
    assert "WARNING: plaintext gRPC" in err
    assert code == exitcodes.UNAVAILABLE


def test_coordinator_kit_config_works_as_is(pki, aggregator, tmp_path, capsys):
    """`dpfed sites list --config coordinator.toml` with the kit file, only the port changed."""
    ours, _ = pki
    _, address = aggregator
    kit = tmp_path / "coord"
    shutil.copytree(kit_dir(ours, "coordinator", "coord"), kit)
    config = kit / "coordinator.toml"
    config.write_text(config.read_text().replace('"127.0.0.1:50051"', f'"{address}"'))
    code, err = _run_cli(["sites", "list", "--config", str(config), "--json"], capsys)
    assert code == exitcodes.OK, err
    assert "plaintext" not in err


def test_site_check_verifies_the_certificate(pki, tmp_path, capsys):
    ours, _ = pki
    config = _site_kit_with_data(ours, tmp_path, "127.0.0.1:1")
    code, err = _run_cli(["site", "check", "--config", str(config)], capsys)
    assert code == exitcodes.OK, err
    # site-b's certificate in site-a's config: check names the mismatch.
    text = config.read_text().replace('cert = "tls/site-a.pem"', 'cert = "tls/site-b.pem"')
    shutil.copy(kit_dir(ours, "site", "site-b") / "tls" / "site-b.pem",
                config.parent / "tls" / "site-b.pem")
    config.write_text(text)
    code, err = _run_cli(["site", "check", "--config", str(config)], capsys)
    assert code == exitcodes.USAGE and "dpfed://site/site-b" in err


def test_serve_commands_refuse_a_certificate_of_another_party(pki, tmp_path, capsys):
    """site-b's certificate in site-a's kit: `dpfed site serve` exits 2 before dialling."""
    ours, _ = pki
    config = _site_kit_with_data(ours, tmp_path, "127.0.0.1:1")
    for suffix in ("pem", "key"):
        shutil.copy(kit_dir(ours, "site", "site-b") / "tls" / f"site-b.{suffix}",
                    config.parent / "tls" / f"site-a.{suffix}")
    code, err = _run_cli(["site", "serve", "--config", str(config)], capsys)
    assert code == exitcodes.USAGE and "dpfed://site/site-b" in err
    # The aggregator with a site's certificate as its own.
    kit = tmp_path / "agg"
    shutil.copytree(kit_dir(ours, "aggregator", "aggregator"), kit)
    for suffix in ("pem", "key"):
        shutil.copy(kit_dir(ours, "site", "site-a") / "tls" / f"site-a.{suffix}",
                    kit / "tls" / f"aggregator.{suffix}")
    code, err = _run_cli(["aggregator", "serve", "--config", str(kit / "aggregator.toml")], capsys)
    assert code == exitcodes.USAGE and "dpfed://aggregator" in err
