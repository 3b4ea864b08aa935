"""dpfed provision: the CA, the kits, their permissions, and adding parties later without
touching anything already issued."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from dpfed import exitcodes
from dpfed.identity import identities_of

PROJECT = """\
federation = "test-fed"
sites = ["hospital-a", "hospital-b"]
coordinators = ["coordinator"]

[aggregator]
address = "agg.example.org:50051"
hostnames = ["localhost"]
ip_addresses = ["127.0.0.1", "10.0.0.5"]

[site_policy]
total_epsilon = 8.0
"""


def run_cli(argv, capsys):
    from dpfed_apps import cli
    code = cli.main(["--log-level", "ERROR", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def federation(tmp_path, capsys):
    project = tmp_path / "project.toml"
    project.write_text(PROJECT)
    out = tmp_path / "fed"
    code, stdout, err = run_cli(["provision", "--project", str(project), "--out", str(out),
                                 "--json"], capsys)
    assert code == exitcodes.OK, err
    return project, out, json.loads(stdout)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_report_and_kit_contents(federation):
    _, out, report = federation
    assert report["ca"] == "created"
    assert sorted((r["kind"], r["id"]) for r in report["created"]) == [
        ("aggregator", "aggregator"), ("coordinator", "coordinator"), ("site", "hospital-a"),
        ("site", "hospital-b")]
    site = out / "sites" / "hospital-a"
    assert {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()} == {
        "START.md", "site.toml", "tls/ca.pem", "tls/hospital-a.pem", "tls/hospital-a.key",
        "keys/hospital-a.key", "keys/hospital-a.pub", "keys/coordinator.pub"}
    agg = out / "aggregator"
    assert {str(p.relative_to(agg)) for p in agg.rglob("*") if p.is_file()} == {
        "START.md", "aggregator.toml", "tls/ca.pem", "tls/aggregator.pem", "tls/aggregator.key", "tls/crl.pem",
        "keys/aggregator.key", "keys/aggregator.pub",
        "keys/hospital-a.pub", "keys/hospital-b.pub", "keys/coordinator.pub"}
    coord = out / "coordinators" / "coordinator"
    assert {str(p.relative_to(coord)) for p in coord.rglob("*") if p.is_file()} == {
        "START.md", "coordinator.toml", "tls/ca.pem", "tls/coordinator.pem",
        "tls/coordinator.key", "keys/coordinator.key", "keys/coordinator.pub"}
    # The aggregator holds the same public signing keys the parties were given.
    assert (agg / "keys/hospital-a.pub").read_bytes() == (site / "keys/hospital-a.pub").read_bytes()
    assert (site / "keys/coordinator.pub").read_bytes() == (coord / "keys/coordinator.pub").read_bytes()
    # The CA records the public half of the aggregator's identity key (the coordinators' pin).
    assert (out / "public/aggregator.pub").read_bytes() == \
        (agg / "keys/aggregator.pub").read_bytes()


def test_certificates_name_their_party_and_chain_to_the_ca(federation):
    _, out, _ = federation
    ca = load_cert(out / "ca" / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for kit, kind, name in [("sites/hospital-a", "site", "hospital-a"),
                            ("coordinators/coordinator", "coordinator", "coordinator"),
                            ("aggregator", "aggregator", "aggregator")]:
        cert = load_cert(out / kit / "tls" / f"{name}.pem")
        cert.verify_directly_issued_by(ca)
        assert identities_of(cert) == [(kind, name)]
        assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == name
        assert (out / kit / "tls" / "ca.pem").read_bytes() == (out / "ca" / "ca.pem").read_bytes()
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH if kind == "aggregator"
                             else ExtendedKeyUsageOID.CLIENT_AUTH]
    san = load_cert(out / "aggregator/tls/aggregator.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    # The dialled host is added to the listed names.
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "agg.example.org"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"),
                                                        ipaddress.ip_address("10.0.0.5")]
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["dpfed://aggregator"]


def test_private_keys_are_owner_only(federation):
    _, out, _ = federation
    keys = [p for p in out.rglob("*.key")]
    # CA, 4 TLS keys, 4 signing keys (the aggregator's signs its secure-aggregation messages)
    assert len(keys) == 9
    for key in keys:
        assert mode(key) == 0o600, key
        assert mode(key.parent) == 0o700, key.parent
    for folder in [out, out / "ca", out / "aggregator", out / "sites", out / "sites/hospital-a",
                   out / "coordinators/coordinator"]:
        assert mode(folder) == 0o700, folder


def test_templates_parse_with_the_real_loaders(federation):
    from aggregator.config import load_config as load_aggregator
    from aggregator.registry import Registry
    from site_node.config import load_config as load_site

    _, out, _ = federation
    site = load_site(out / "sites/hospital-a/site.toml")
    assert site.tls is not None and site.tls.key.stat().st_mode & 0o077 == 0
    assert site.site_id == "hospital-a" and site.aggregator == "agg.example.org:50051"
    assert site.policy.total_epsilon == 8.0
    agg = load_aggregator(out / "aggregator/aggregator.toml")
    assert not agg.insecure and agg.tls.cert.name == "aggregator.pem"
    from aggregator.server import load_signing_key
    from coordinator.client import load_aggregator_key
    assert load_signing_key(agg).key_id == load_aggregator_key(out / "public/aggregator.pub")
    assert Registry.from_config(agg).site_ids() == ["hospital-a", "hospital-b"]
    coord = tomllib.loads((out / "coordinators/coordinator/coordinator.toml").read_text())
    assert coord["coordinator_id"] == "coordinator" and "insecure" not in coord
    for key in ("ca_cert", "cert", "key"):
        assert (out / "coordinators/coordinator" / coord["tls"][key]).is_file()


def test_rerun_changes_nothing(federation, capsys):
    project, out, _ = federation
    before = snapshot(out)
    code, stdout, _ = run_cli(["provision", "--project", str(project), "--out", str(out),
                               "--json"], capsys)
    assert code == exitcodes.OK
    report = json.loads(stdout)
    assert report["ca"] == "reused" and report["created"] == [] and report["additions"] == []
    assert snapshot(out) == before


@pytest.mark.parametrize("how", ["flag", "project"])
def test_adding_a_site_leaves_existing_kits_byte_identical(federation, capsys, how):
    from aggregator.config import config_from_dict
    from aggregator.registry import Registry

    project, out, _ = federation
    before = snapshot(out)
    argv = ["provision", "--project", str(project), "--out", str(out), "--json"]
    if how == "flag":
        argv += ["--add-site", "hospital-c"]
    else:
        project.write_text(PROJECT.replace('"hospital-b"]', '"hospital-b", "hospital-c"]'))
    code, stdout, err = run_cli(argv, capsys)
    assert code == exitcodes.OK, err
    report = json.loads(stdout)
    assert [(r["kind"], r["id"]) for r in report["created"]] == [("site", "hospital-c")]
    after = snapshot(out)
    # Every file that existed is byte-identical: same CA, same kits, same aggregator.toml.
    assert {k: after[k] for k in before} == before
    new = set(after) - set(before)
    assert {n for n in new if not n.startswith(("sites/hospital-c/",
                                                "public/issued/site-hospital-c-"))} == {
        "public/sites/hospital-c.pem", "public/sites/hospital-c.pub",
        "aggregator/keys/hospital-c.pub", "aggregator/add-sites/hospital-c.toml"}
    load_cert(out / "sites/hospital-c/tls/hospital-c.pem").verify_directly_issued_by(
        load_cert(out / "ca/ca.pem"))
    # The addition, appended to aggregator.toml as the kit says, registers the site.
    agg = out / "aggregator"
    raw = tomllib.loads((agg / "aggregator.toml").read_text() + "\n"
                        + (agg / "add-sites/hospital-c.toml").read_text())
    assert Registry.from_config(config_from_dict(raw, agg)).site_ids() == [
        "hospital-a", "hospital-b", "hospital-c"]
    if how == "flag":
        assert "hospital-c" in err   # reminder to record it in project.toml


def test_a_party_is_never_issued_twice_even_if_its_kit_was_handed_over(federation, capsys):
    """Kits leave the provisioning machine; public/ remembers what was issued."""
    import shutil

    project, out, _ = federation
    shutil.rmtree(out / "sites" / "hospital-a")
    code, stdout, _ = run_cli(["provision", "--project", str(project), "--out", str(out),
                               "--json"], capsys)
    assert code == exitcodes.OK
    assert json.loads(stdout)["created"] == []
    assert not (out / "sites" / "hospital-a").exists()


def test_ca_key_readable_by_others_is_refused(federation, capsys):
    project, out, _ = federation
    os.chmod(out / "ca" / "ca.key", 0o644)
    code, _, err = run_cli(["provision", "--project", str(project), "--out", str(out),
                            "--add-site", "hospital-z"], capsys)
    assert code == exitcodes.USAGE and "chmod 600" in err
    assert not (out / "sites" / "hospital-z").exists()


def test_other_federation_in_the_same_folder_is_refused(federation, capsys, tmp_path):
    _, out, _ = federation
    other = tmp_path / "other.toml"
    other.write_text(PROJECT.replace('"test-fed"', '"another"'))
    code, _, err = run_cli(["provision", "--project", str(other), "--out", str(out)], capsys)
    assert code == exitcodes.USAGE and "test-fed" in err


@pytest.mark.parametrize("edit,message", [
    (('federation = "test-fed"\n', ""), "federation"),
    (('"hospital-b"]', '"hospital-b", "../evil"]'), "../evil"),
    (('"hospital-b"]', '"hospital-b", "hospital-a"]'), "twice"),
    (('coordinators = ["coordinator"]', "coordinators = []"), "coordinator"),
    (('address = "agg.example.org:50051"', 'address = "agg.example.org"'), "host:port"),
    (('"10.0.0.5"', '"not-an-ip"'), "not-an-ip"),
])
def test_invalid_project_exits_2(tmp_path, capsys, edit, message):
    project = tmp_path / "project.toml"
    assert edit[0] in PROJECT
    project.write_text(PROJECT.replace(*edit))
    code, _, err = run_cli(["provision", "--project", str(project), "--out",
                            str(tmp_path / "fed")], capsys)
    assert code == exitcodes.USAGE and message in err
    assert not (tmp_path / "fed" / "ca").exists()


def test_a_half_written_kit_from_a_crash_is_replaced(tmp_path):
    from dpfed_apps.ca import project_from_dict, provision

    project = project_from_dict(tomllib.loads(PROJECT))
    out = tmp_path / "fed"
    (out / "sites" / ".hospital-a.partial" / "tls").mkdir(parents=True)
    (out / "sites" / ".hospital-a.partial" / "junk").write_text("x")
    provision(project, out)
    assert not (out / "sites" / ".hospital-a.partial").exists()
    assert (out / "sites" / "hospital-a" / "site.toml").exists()
