"""Provisioning a federation: one kit per party, issued by the federation's CA.

``dpfed provision --project project.toml --out DIR`` (dpfed_apps.commands.provision) makes the
CA on first use and a kit for every party (folder layout: dpfed_apps.ca.layout).

- Issuing is append-only. A party that has a public/ entry was issued once and is never issued
  again, so a re-run (or ``--add-site``) never rotates the CA or changes an existing kit; files
  that must change (the aggregator's list of sites) get an addition file next to them instead.
- Kits are assembled in a hidden temporary folder and renamed into place, so a crash never
  leaves a half-written kit that a re-run would then skip.

Every private key is written 0600 in a 0700 folder; kits are 0700 as a whole.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from dpfed.identity import AGGREGATOR, COORDINATOR, SITE, identity_uri
from dpfed.wire.signing import SigningKey, public_key_pem
from dpfed_apps.ca.authority import (CertificateAuthority, cert_pem, make_private_dir, write_crl,
                                     write_private)
from dpfed_apps.ca.layout import CRL_NAME, aggregator_key_path, crl_path, kit_dir, public_dir
from dpfed_apps.ca.project import Project, ProvisionError
from dpfed_apps.ca.records import record_issued
from dpfed_apps.ca.requests import Request
from dpfed_apps.ca.templates import (aggregator_toml, coordinator_entry, coordinator_toml,
                                     site_entry, site_toml, start_md)


@dataclass
class ProvisionReport:
    out: Path
    ca: str = "reused"                     # "created" or "reused"
    created: list[tuple[str, str, Path]] = field(default_factory=list)   # kind, id, kit folder
    existing: list[tuple[str, str]] = field(default_factory=list)
    additions: list[Path] = field(default_factory=list)   # files added next to existing kits

    def to_dict(self) -> dict:
        return {"out": str(self.out), "ca": self.ca,
                "created": [{"kind": k, "id": i, "path": str(p)} for k, i, p in self.created],
                "existing": [{"kind": k, "id": i} for k, i in self.existing],
                "additions": [str(p) for p in self.additions]}


def _issued(out: Path, kind: str, party_id: str) -> bool:
    return (public_dir(out, kind) / f"{party_id}.pub").exists()


class _KitBuilder:
    """Writes a kit into a hidden folder next to its place; ``commit`` renames it in."""

    def __init__(self, final: Path):
        self.final = final
        if final.exists():
            raise ProvisionError(f"{final} exists but was not issued by this CA's records "
                                 "(public/): move it away or restore public/")
        self.tmp = final.parent / f".{final.name}.partial"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)   # a previous run died here: nothing in it was handed out
        make_private_dir(final.parent)
        make_private_dir(self.tmp)
        make_private_dir(self.tmp / "tls")
        make_private_dir(self.tmp / "keys")

    def write(self, rel: str, data: bytes | str, *, private: bool = False) -> None:
        path = self.tmp / rel
        data = data.encode() if isinstance(data, str) else data
        if private:
            write_private(path, data)
        else:
            path.write_bytes(data)

    def commit(self) -> Path:
        os.rename(self.tmp, self.final)
        return self.final


def _issue_party(ca: CertificateAuthority, project: Project, out: Path, kind: str,
                 party_id: str, coordinators: list[str], request: Request | None = None) -> Path:
    """A new site or coordinator kit; its public parts are recorded in public/. With a
    ``request`` (``dpfed csr`` at the party) the kit holds no private key: the certificate is
    for the party's own TLS key and the signing key is the party's."""
    kit = _KitBuilder(kit_dir(out, kind, party_id))
    if request is None:
        tls_key, tls_cert = ca.issue(kind, party_id, days=project.cert_days)
        signing = SigningKey.generate()
        pub = public_key_pem(signing.public_key)
        kit.write(f"tls/{party_id}.key", tls_key, private=True)
        signing.save(kit.tmp / "keys" / f"{party_id}.key", kit.tmp / "keys" / f"{party_id}.pub")
    else:
        tls_cert = ca.issue_for_key(kind, party_id, request.tls_public_key, days=project.cert_days)
        pub = request.signing_public_pem
        kit.write(f"keys/{party_id}.pub", pub)
    kit.write(f"tls/{party_id}.pem", tls_cert)
    kit.write("tls/ca.pem", cert_pem(ca.cert))
    if kind == SITE:
        for c in coordinators:
            kit.write(f"keys/{c}.pub", (public_dir(out, COORDINATOR) / f"{c}.pub").read_bytes())
        kit.write("site.toml", site_toml(project, party_id, coordinators))
    else:
        kit.write("coordinator.toml", coordinator_toml(project, party_id))
    kit.write("START.md", start_md(kind, name=party_id, federation=project.federation,
                                  address=project.aggregator_address))
    # Public record first: if the rename below fails, a re-run refuses rather than re-issuing.
    pdir = public_dir(out, kind)
    pdir.mkdir(parents=True, exist_ok=True)
    (pdir / f"{party_id}.pem").write_bytes(tls_cert)
    (pdir / f"{party_id}.pub").write_bytes(pub)
    record_issued(out, kind, party_id, tls_cert)
    return kit.commit()


def _issue_aggregator(ca: CertificateAuthority, project: Project, out: Path,
                      sites: list[str], coordinators: list[str],
                      request: Request | None = None) -> Path:
    """The aggregator's kit. Like every party it has an Ed25519 identity key: it signs the
    aggregator's secure-aggregation messages, which the sites verify against the key id the
    coordinator pins from public/aggregator.pub (docs/security.md)."""
    kit = _KitBuilder(kit_dir(out, AGGREGATOR, AGGREGATOR))
    names = dict(dns_names=project.hostnames, ip_addresses=project.ip_addresses)
    if request is None:
        tls_key, tls_cert = ca.issue(AGGREGATOR, AGGREGATOR, days=project.cert_days, **names)
        kit.write("tls/aggregator.key", tls_key, private=True)
        signing = SigningKey.generate()
        pub = public_key_pem(signing.public_key)
        signing.save(kit.tmp / "keys" / "aggregator.key", kit.tmp / "keys" / "aggregator.pub")
    else:
        tls_cert = ca.issue_for_key(AGGREGATOR, AGGREGATOR, request.tls_public_key,
                                    days=project.cert_days, **names)
        pub = request.signing_public_pem
        kit.write("keys/aggregator.pub", pub)
    kit.write("tls/aggregator.pem", tls_cert)
    kit.write("tls/ca.pem", cert_pem(ca.cert))
    if crl_path(out).exists():
        kit.write(f"tls/{CRL_NAME}", crl_path(out).read_bytes())
    for kind, ids in ((SITE, sites), (COORDINATOR, coordinators)):
        for i in ids:
            kit.write(f"keys/{i}.pub", (public_dir(out, kind) / f"{i}.pub").read_bytes())
    kit.write("aggregator.toml", aggregator_toml(project, sites, coordinators))
    names = ", ".join([*project.hostnames, *project.ip_addresses])
    kit.write("START.md", start_md(
        AGGREGATOR, 
        federation=project.federation, listen=project.listen, names=names,
        address=project.aggregator_address, port=project.listen.rsplit(":", 1)[1]))
    (out / "public" / "aggregator.pem").write_bytes(tls_cert)
    aggregator_key_path(out).write_bytes(pub)
    record_issued(out, AGGREGATOR, AGGREGATOR, tls_cert)
    return kit.commit()


def _add_to_aggregator(out: Path, kind: str, party_id: str) -> list[Path]:
    """A party issued after the aggregator kit: its public key and the block to append to
    aggregator.toml go next to the kit; existing files stay byte-identical."""
    kit = kit_dir(out, AGGREGATOR, AGGREGATOR)
    pub = kit / "keys" / f"{party_id}.pub"
    if pub.exists():
        return []
    pub.write_bytes((public_dir(out, kind) / f"{party_id}.pub").read_bytes())
    folder = kit / ("add-sites" if kind == SITE else "add-coordinators")
    folder.mkdir(mode=0o700, exist_ok=True)
    snippet = folder / f"{party_id}.toml"
    block = site_entry(party_id) if kind == SITE else coordinator_entry(party_id)
    snippet.write_text(f"# Append to aggregator.toml to register {kind} {party_id!r}, then "
                       f"restart the aggregator.\n{block}")
    return [pub, snippet]


def provision(project: Project, out: str | Path,
              requests: list[Request] | tuple[Request, ...] = ()) -> ProvisionReport:
    """Create (or extend) the federation in ``out``: the CA on first use, then a kit for every
    party of ``project`` that was never issued. Existing kits and the CA are never changed.

    A party with a request in ``requests`` (made at the party by ``dpfed csr``) gets a kit
    without private keys: a certificate for its own TLS key, its own signing key's public half
    registered. The others get centrally generated keys (demos)."""
    out = Path(out)
    by_party: dict[tuple[str, str], Request] = {}
    for r in requests:
        listed = (project.sites if r.kind == SITE else project.coordinators
                  if r.kind == COORDINATOR else (AGGREGATOR,))
        if r.party_id not in listed:
            raise ProvisionError(f"the request for {identity_uri(r.kind, r.party_id)} names a "
                                 f"party that project.toml does not list")
        if (r.kind, r.party_id) in by_party:
            raise ProvisionError(f"two requests for {identity_uri(r.kind, r.party_id)}")
        by_party[(r.kind, r.party_id)] = r
    report = ProvisionReport(out)
    make_private_dir(out)
    ca_dir = out / "ca"
    if (ca_dir / "ca.key").exists() or (ca_dir / "ca.pem").exists():
        ca = CertificateAuthority.load(ca_dir)
        if ca.federation != project.federation:
            raise ProvisionError(f"{out} holds the CA of federation {ca.federation!r}, not "
                                 f"{project.federation!r}")
    else:
        ca = CertificateAuthority.create(project.federation)
        ca.save(ca_dir)
        report.ca = "created"
        (out / "public").mkdir(exist_ok=True)
        write_crl(ca, crl_path(out), {})    # empty: the aggregator kit carries a copy
    (out / "public").mkdir(exist_ok=True)
    (out / "public" / "ca.pem").write_bytes(cert_pem(ca.cert))
    if not crl_path(out).exists():          # a federation provisioned before revocation lists
        write_crl(ca, crl_path(out), {})

    # Coordinators first: site kits carry their public keys.
    for kind, ids in ((COORDINATOR, project.coordinators), (SITE, project.sites)):
        for party in ids:
            if _issued(out, kind, party):
                if (kind, party) in by_party:
                    raise ProvisionError(f"{identity_uri(kind, party)} was already issued: a "
                                         "new key for it is `dpfed provision renew --csr`")
                report.existing.append((kind, party))
                continue
            path = _issue_party(ca, project, out, kind, party, list(project.coordinators),
                                by_party.get((kind, party)))
            report.created.append((kind, party, path))

    agg_kit = kit_dir(out, AGGREGATOR, AGGREGATOR)
    if agg_kit.exists():
        if (AGGREGATOR, AGGREGATOR) in by_party:
            raise ProvisionError("the aggregator was already issued: a new key for it is "
                                 "`dpfed provision renew aggregator --csr`")
        report.existing.append((AGGREGATOR, AGGREGATOR))
        for kind, party, _ in report.created:
            report.additions += _add_to_aggregator(out, kind, party)
    else:
        path = _issue_aggregator(ca, project, out, list(project.sites), list(project.coordinators),
                                 by_party.get((AGGREGATOR, AGGREGATOR)))
        report.created.append((AGGREGATOR, AGGREGATOR, path))
    return report
