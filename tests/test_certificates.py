"""Issue 11, finding 8: certificates in production.

- Parties make their own keys and send a certificate request (`dpfed csr`); the CA signs it
  (`dpfed provision --csr`): the CA's folder never holds a party's private key, and the issued
  certificates carry a real round over mutual TLS.
- `dpfed provision renew` (same key, or a new key by request) and `dpfed provision revoke`
  (an X.509 CRL the aggregator loads from `[tls] crl`, re-reads when it changes and checks on
  every call).
- Certificates last 397 days by default; `dpfed site check` and the serve commands warn 30 days
  before expiry.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from aggregator.config import ConfigError, config_from_dict, load_config as load_aggregator_config
from aggregator.server import AggregatorServer
from coordinator.client import Coordinator
from dpfed import exitcodes
from dpfed_apps.cli import main
from dpfed.identity import certificate_problems, expiry_warning
from dpfed_apps.ca import (DEFAULT_CERT_DAYS, ProvisionError, kit_dir, kit_tls, load_request,
                           make_request, project_from_dict, provision)
from dpfed.transport import TlsFiles, client_channel
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.signing import SigningKey
from tests.test_site_node import make_spec

ROOT = Path(__file__).resolve().parents[1]
SITES = ("site-a", "site-b")
PROJECT = {"federation": "csr-test", "sites": list(SITES), "coordinators": ["coord"],
           "aggregator": {"address": "127.0.0.1:50051"}}


def cert_of(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def spki(key_or_cert) -> bytes:
    key = key_or_cert.public_key() if hasattr(key_or_cert, "public_key") else key_or_cert
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def party_folders(root: Path) -> dict[str, Path]:
    return {"aggregator": root / "parties" / "aggregator", "coord": root / "parties" / "coord",
            **{s: root / "parties" / s for s in SITES}}


@pytest.fixture
def csr_federation(tmp_path, capsys):
    """Every party runs `dpfed csr` in its own folder; the CA signs the requests (it gets only
    request/: the CSR and the signing key's public half); each party copies its reply kit over
    its folder."""
    parties = party_folders(tmp_path)
    flags = {"aggregator": ["--aggregator"], "coord": ["--coordinator", "coord"],
             **{s: ["--site", s] for s in SITES}}
    inbox = tmp_path / "ca-inbox"
    inbox.mkdir()
    for name, folder in parties.items():
        assert main(["csr", *flags[name], "--out", str(folder)]) == exitcodes.OK
        for f in (folder / "request").iterdir():          # what travels to the CA
            shutil.copy(f, inbox / f.name)
    (tmp_path / "project.toml").write_text(
        'federation = "csr-test"\nsites = ["site-a", "site-b"]\ncoordinators = ["coord"]\n'
        '[aggregator]\naddress = "127.0.0.1:50051"\n')
    out = tmp_path / "federation"
    argv = ["provision", "--project", str(tmp_path / "project.toml"), "--out", str(out)]
    for name in parties:
        argv += ["--csr", str(inbox / f"{name}.csr")]
    assert main(argv) == exitcodes.OK
    capsys.readouterr()
    kinds = {"aggregator": "aggregator", "coord": "coordinator", **{s: "site" for s in SITES}}
    for name, folder in parties.items():                     # the reply goes back
        shutil.copytree(kit_dir(out, kinds[name], name), folder, dirs_exist_ok=True)
    return out, parties


def private_key_pems(parties: dict[str, Path]) -> list[bytes]:
    return [p.read_bytes() for folder in parties.values()
            for p in (*folder.glob("tls/*.key"), *folder.glob("keys/*.key"))]


def test_csr_flow_the_ca_never_holds_a_party_private_key(csr_federation):
    out, parties = csr_federation
    secrets = private_key_pems(parties)
    assert len(secrets) == 2 * len(SITES) + 2 + 2   # TLS + signing key per party
    key_files = [p.relative_to(out) for p in out.rglob("*.key")]
    assert key_files == [Path("ca/ca.key")]          # no kit in the CA's folder holds a key
    for path in (p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for secret in secrets:
            body = b"".join(secret.splitlines()[1:-1])          # the base64 of the key itself
            assert body not in b"".join(data.splitlines()), f"{path} holds a party's private key"
    # Each certificate is for the key the party made, and names the party.
    for name, kind in (("site-a", "site"), ("coord", "coordinator"), ("aggregator", "aggregator")):
        folder = parties[name]
        key = serialization.load_pem_private_key((folder / "tls" / f"{name}.key").read_bytes(), None)
        assert spki(cert_of(folder / "tls" / f"{name}.pem")) == spki(key.public_key())
        assert certificate_problems(kit_tls(folder, name), kind, name) == []
    # The registered signing keys are the parties' own.
    for name in (*SITES, "coord"):
        own = SigningKey.load(parties[name] / "keys" / f"{name}.key")
        assert (parties["aggregator"] / "keys" / f"{name}.pub").read_bytes() == \
            (parties[name] / "keys" / f"{name}.pub").read_bytes()
        assert own.key_id
    # The aggregator's identity key (it signs its secure-aggregation messages) is its own too,
    # and the CA records its public half for the coordinators' pin.
    from coordinator.client import load_aggregator_key
    own = SigningKey.load(parties["aggregator"] / "keys" / "aggregator.key")
    assert load_aggregator_key(out / "public" / "aggregator.pub") == own.key_id


def test_requests_are_checked(tmp_path):
    made = make_request("site", "site-a", tmp_path / "a")
    # A request for a party project.toml does not list
    stranger = make_request("site", "site-z", tmp_path / "z")
    with pytest.raises(ProvisionError, match="does not list"):
        provision(project_from_dict(PROJECT), tmp_path / "fed", [load_request(stranger["csr"])])
    # A CSR whose signature does not verify (the key was swapped after signing)
    csr = made["csr"].read_bytes()
    other = make_request("site", "site-a", tmp_path / "b")["csr"].read_bytes()
    forged = tmp_path / "site-a.csr"
    forged.write_bytes(csr[:-200] + other[-200:])
    with pytest.raises(ProvisionError):
        load_request(forged)
    # Without the signing key's public half next to it
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(made["csr"], lone)
    with pytest.raises(ProvisionError, match="public half"):
        load_request(lone / "site-a.csr")
    # The keys are not made twice by accident
    with pytest.raises(ProvisionError, match="exists"):
        make_request("site", "site-a", tmp_path / "a")
    assert (tmp_path / "a" / "tls" / "site-a.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "a" / "keys" / "site-a.key").stat().st_mode & 0o077 == 0


def _site_data(folder: Path, address: str) -> Path:
    rng = np.random.default_rng(0)
    rows = ["id,g1,g2,g3,drug"]
    for i in range(200):
        x = rng.normal(size=3)
        rows.append(f"{i},{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{x.sum() + rng.normal():.4f}")
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "CHANGE-ME.csv").write_text("\n".join(rows) + "\n")
    config = folder / "site.toml"
    config.write_text(config.read_text().replace('"127.0.0.1:50051"', f'"{address}"'))
    return config


def _start_aggregator(folder: Path, tmp_path: Path):
    raw = tomllib.loads((folder / "aggregator.toml").read_text())
    raw.update(listen="127.0.0.1:0", state_db=str(tmp_path / "agg.sqlite"), grace_s=0.2)
    server = AggregatorServer(config_from_dict(raw, folder))
    return server, f"127.0.0.1:{server.start()}"


def _coordinator(folder: Path, address: str) -> Coordinator:
    return Coordinator(address, SigningKey.load(folder / "keys" / "coord.key"), "coord",
                       kit_tls(folder, "coord"), timeout_s=10)


def test_csr_issued_certificates_carry_a_round_over_mutual_tls(csr_federation, tmp_path):
    from site_node.client import Backoff, SiteClient
    from site_node.config import load_config
    from site_node.node import SiteNode

    out, parties = csr_federation
    server, address = _start_aggregator(parties["aggregator"], tmp_path)
    config = load_config(_site_data(parties["site-a"], address))
    node = SiteNode(config)
    client = SiteClient(node, rpc_timeout_s=5, reconnect=Backoff(0.05, 0.2))
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    try:
        with _coordinator(parties["coord"], address) as coordinator:
            deadline = time.monotonic() + 20
            while not any(s.connected for s in coordinator.list_sites() if s.site_id == "site-a"):
                assert time.monotonic() < deadline, "site-a never connected over TLS"
                time.sleep(0.05)
            coordinator.start_round(make_spec(
                "csr-round", coordinator_id="coord", quorum=1,
                deadline_unix_ms=int(time.time() * 1000) + 60_000, fit_method="laplace",
                fit_draws=200, fit_seed=1))
            status = coordinator.wait("csr-round", 60, poll_s=0.05)
            assert status.state == pb.RoundStatus.DONE, status.message
            assert [c.site_id for c in status.contributions] == ["site-a"]
    finally:
        client.stop()
        thread.join(10)
        node.ledger.close()
        server.stop(0)


# ---- renewal ----------------------------------------------------------------------------------


def test_default_validity_is_397_days(tmp_path):
    assert DEFAULT_CERT_DAYS == 397
    provision(project_from_dict(PROJECT), tmp_path / "fed")
    cert = cert_of(tmp_path / "fed" / "public" / "sites" / "site-a.pem")
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds() / 86400
    assert 397 <= days < 397.01


def test_renew_same_key_and_new_key(csr_federation, capsys):
    out, parties = csr_federation
    folder = parties["site-a"]
    old = cert_of(folder / "tls" / "site-a.pem")
    # Same key: the CA needs nothing from the site.
    assert main(["provision", "renew", "site-a", "--out", str(out), "--days", "400"]) == 0
    assert "renewed site-a" in capsys.readouterr().out
    renewed = out / "renewed" / "site-a.pem"
    new = cert_of(renewed)
    assert new.serial_number != old.serial_number and spki(new) == spki(old)
    assert new.not_valid_after_utc > old.not_valid_after_utc
    assert identities(new) == identities(old)
    shutil.copy(renewed, folder / "tls" / "site-a.pem")
    assert certificate_problems(kit_tls(folder, "site-a"), "site", "site-a") == []
    # A new key: the site makes it and a request; its private key still never travels.
    shutil.rmtree(folder / "request")
    assert main(["csr", "--site", "site-a", "--out", str(folder), "--force"]) == 0
    assert main(["provision", "renew", "site-a", "--out", str(out),
                 "--csr", str(folder / "request" / "site-a.csr")]) == 0
    rekeyed = cert_of(out / "renewed" / "site-a.pem")
    key = serialization.load_pem_private_key((folder / "tls" / "site-a.key").read_bytes(), None)
    assert spki(rekeyed) == spki(key.public_key()) != spki(old)
    # Both renewals are on record (for revocation), next to the first certificate.
    assert len(list((out / "public" / "issued").glob("site-site-a-*.pem"))) == 3
    # A request naming another party is refused.
    assert main(["provision", "renew", "site-b", "--out", str(out),
                 "--csr", str(folder / "request" / "site-a.csr")]) == exitcodes.USAGE
    assert "names dpfed://site/site-a" in capsys.readouterr().err
    # And the --reuse-key request is for the key already there.
    assert main(["csr", "--site", "site-a", "--out", str(folder / "again"), "--reuse-key"]) != 0
    capsys.readouterr()


def identities(cert):
    from dpfed.identity import identities_of
    return identities_of(cert)


# ---- revocation --------------------------------------------------------------------------------


def _list_sites_code(folder: Path, name: str, address: str) -> grpc.StatusCode:
    with client_channel(address, kit_tls(folder, name)) as channel:
        try:
            pb_grpc.AggregatorStub(channel).ListSites(pb.ListSitesRequest(), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_revoked_certificates_are_refused_on_every_call_without_restart(csr_federation, tmp_path,
                                                                       capsys):
    out, parties = csr_federation
    agg = parties["aggregator"]
    assert tomllib.loads((agg / "aggregator.toml").read_text())["tls"]["crl"] == "tls/crl.pem"
    server, address = _start_aggregator(agg, tmp_path)
    try:
        assert _list_sites_code(parties["coord"], "coord", address) == grpc.StatusCode.OK
        # A site may not read (PERMISSION_DENIED), but it is authenticated.
        assert _list_sites_code(parties["site-b"], "site-b", address) == \
            grpc.StatusCode.PERMISSION_DENIED
        assert main(["provision", "revoke", "site-b", "--out", str(out)]) == 0
        assert "revoked site-b" in capsys.readouterr().out
        # Not yet copied to the aggregator: nothing changes.
        assert _list_sites_code(parties["site-b"], "site-b", address) == \
            grpc.StatusCode.PERMISSION_DENIED
        shutil.copy(out / "public" / "crl.pem", agg / "tls" / "crl.pem")
        assert _list_sites_code(parties["site-b"], "site-b", address) == \
            grpc.StatusCode.UNAUTHENTICATED
        with client_channel(address, kit_tls(parties["site-b"], "site-b")) as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.AggregatorStub(channel).Contribute(pb.SignedEnvelope(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "revoked" in info.value.details()
        assert _list_sites_code(parties["coord"], "coord", address) == grpc.StatusCode.OK
        # A renewal after the revocation is a new serial: the CA re-admits deliberately. One
        # certificate (the superseded one) can be revoked alone.
        old = cert_of(parties["coord"] / "tls" / "coord.pem")
        assert main(["provision", "renew", "coord", "--out", str(out)]) == 0
        assert main(["provision", "revoke", "coord", "--out", str(out),
                     "--serial", f"{old.serial_number:x}"]) == 0
        shutil.copy(out / "public" / "crl.pem", agg / "tls" / "crl.pem")
        assert _list_sites_code(parties["coord"], "coord", address) == \
            grpc.StatusCode.UNAUTHENTICATED
        shutil.copy(out / "renewed" / "coord.pem", parties["coord"] / "tls" / "coord.pem")
        assert _list_sites_code(parties["coord"], "coord", address) == grpc.StatusCode.OK
        # A broken copy keeps the last good list in force.
        (agg / "tls" / "crl.pem").write_text("not a CRL")
        assert _list_sites_code(parties["site-b"], "site-b", address) == \
            grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)
    capsys.readouterr()
    # The list survives a restart: it is loaded at start.
    shutil.copy(out / "public" / "crl.pem", agg / "tls" / "crl.pem")
    server, address = _start_aggregator(agg, tmp_path)
    try:
        assert _list_sites_code(parties["site-b"], "site-b", address) == \
            grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)


def test_revoke_unknown_party_or_serial_exits_2(csr_federation, capsys):
    out, _ = csr_federation
    assert main(["provision", "revoke", "nobody", "--out", str(out)]) == exitcodes.USAGE
    assert main(["provision", "revoke", "site-a", "--out", str(out), "--serial", "abc"]) == \
        exitcodes.USAGE
    assert "no certificate with serial abc" in capsys.readouterr().err


def test_aggregator_refuses_to_start_with_a_crl_of_another_ca(csr_federation, tmp_path):
    out, parties = csr_federation
    rogue = tmp_path / "rogue"
    provision(project_from_dict({**PROJECT, "federation": "rogue"}), rogue)
    agg = parties["aggregator"]
    shutil.copy(rogue / "public" / "crl.pem", agg / "tls" / "crl.pem")
    raw = tomllib.loads((agg / "aggregator.toml").read_text())
    raw.update(listen="127.0.0.1:0", state_db=str(tmp_path / "agg.sqlite"))
    with pytest.raises(ConfigError, match="not signed by the federation's CA"):
        AggregatorServer(config_from_dict(raw, agg)).start()
    (agg / "tls" / "crl.pem").unlink()
    with pytest.raises(ConfigError, match="tls.crl"):
        load_aggregator_config(agg / "aggregator.toml")


# ---- expiry ------------------------------------------------------------------------------------


def test_expiry_warning_30_days_ahead(tmp_path, capsys):
    provision(project_from_dict({**PROJECT, "cert_days": 20}), tmp_path / "fed")
    kit = kit_dir(tmp_path / "fed", "site", "site-a")
    assert "expires on" in expiry_warning(kit / "tls" / "site-a.pem")
    assert expiry_warning(kit / "tls" / "site-a.pem", within_days=10) is None
    assert expiry_warning(kit / "tls" / "site-a.pem",
                          now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=30)) is None
    (kit / "data").mkdir()
    (kit / "data" / "CHANGE-ME.csv").write_text("id,x,y\n" + "".join(
        f"{i},{i % 7},{i % 5}\n" for i in range(60)))
    main(["site", "check", "--config", str(kit / "site.toml")])
    assert "site-a.pem expires on" in capsys.readouterr().err
    provision(project_from_dict(PROJECT), tmp_path / "fed397")
    assert expiry_warning(tmp_path / "fed397" / "public" / "sites" / "site-a.pem") is None


@pytest.mark.slow
def test_aggregator_serve_warns_before_expiry(tmp_path):
    out = tmp_path / "fed"
    provision(project_from_dict({**PROJECT, "cert_days": 20}), out)
    agg = kit_dir(out, "aggregator", "aggregator")
    config = agg / "aggregator.toml"
    config.write_text(config.read_text().replace('listen = "0.0.0.0:50051"',
                                                 'listen = "127.0.0.1:0"'))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dpfed_apps.cli", "aggregator", "serve",
                             "--config", str(config)], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    try:
        seen = ""
        deadline = time.monotonic() + 120
        while "listening" not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stderr.readline()
        assert "aggregator.pem expires on" in seen, seen
        assert "listening" in seen, seen
    finally:
        proc.terminate()
        proc.wait(30)
