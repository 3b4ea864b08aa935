"""Provisioning a federation: its certificate authority and one kit per party.

``dpfed provision --project project.toml --out DIR`` (dpfed_apps.commands.provision) makes

    DIR/ca/ca.key, ca.pem         the federation CA (ECDSA P-256; key 0600, folder 0700)
    DIR/public/                   every public thing: ca.pem, sites/<id>.pub|.pem,
                                  coordinators/<id>.pub|.pem (what was issued, and to whom)
    DIR/aggregator/               kit: aggregator.toml, START.md, tls/, keys/*.pub
    DIR/sites/<site_id>/          kit: site.toml, START.md, tls/, keys/
    DIR/coordinators/<id>/        kit: coordinator.toml, START.md, tls/, keys/

Why these choices:
- TLS keys and the CA are ECDSA P-256: every TLS stack (gRPC's BoringSSL included) accepts
  it for certificates and handshakes. Ed25519 stays for payload signatures (dpfed.wire.signing):
  the signature on a release outlives the connection that carried it.
- A certificate's identity is its SAN URI, ``dpfed://site/<id>``, ``dpfed://coordinator/<id>``
  or ``dpfed://aggregator`` (also the subject CN). The aggregator binds it to the signing key's
  registered owner (aggregator.identity), so a stolen signing key is useless without the
  matching certificate and the other way round.
- Issuing is append-only. A party that has a public/ entry was issued once and is never issued
  again, so a re-run (or ``--add-site``) never rotates the CA or changes an existing kit; files
  that must change (the aggregator's list of sites) get an addition file next to them instead.
- Kits are assembled in a hidden temporary folder and renamed into place, so a crash never
  leaves a half-written kit that a re-run would then skip.

Every private key is written 0600 in a 0700 folder; kits are 0700 as a whole.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import shutil
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpfed.wire.signing import SigningKey, public_key_pem

URI_SCHEME = "dpfed"
SITE, COORDINATOR, AGGREGATOR = "site", "coordinator", "aggregator"
KINDS = (SITE, COORDINATOR, AGGREGATOR)
CA_DAYS = 3650
DEFAULT_CERT_DAYS = 397          # the CA/Browser Forum ceiling for TLS leaf certificates;
                                 # renew with `dpfed provision renew` (docs/security.md)
EXPIRY_WARNING_DAYS = 30         # `dpfed site check` and the serve commands warn this early
_BACKDATE = dt.timedelta(minutes=5)  # tolerate small clock differences between parties
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

DEFAULT_POLICY = {"max_epsilon_per_round": 2.0, "total_epsilon": 10.0, "min_n": 20,
                  "allowed_targets": ["*"], "allowed_features": ["*"]}


class ProvisionError(ValueError):
    """project.toml is invalid, or DIR holds something that contradicts it."""


# Every key project.toml may have, per table; anything else is an error naming the nearest
# valid key (dpfed.configkeys).
PROJECT_KEYS = frozenset({"federation", "sites", "coordinators", "cert_days", "aggregator",
                          "site_policy"})
PROJECT_AGGREGATOR_KEYS = frozenset({"address", "listen", "hostnames", "ip_addresses"})


def _check_project_keys(raw: dict) -> None:
    from dpfed.configkeys import unknown_key_problems
    problems = unknown_key_problems(raw, PROJECT_KEYS)
    if isinstance(raw.get("aggregator"), dict):
        problems += unknown_key_problems(raw["aggregator"], PROJECT_AGGREGATOR_KEYS,
                                         prefix="aggregator.")
    if isinstance(raw.get("site_policy"), dict):
        problems += unknown_key_problems(raw["site_policy"], DEFAULT_POLICY,
                                         prefix="site_policy.")
    for table, id_key in (("sites", "site_id"), ("coordinators", "coordinator_id")):
        items = raw.get(table)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, dict):
                problems += unknown_key_problems(item, {id_key}, prefix=f"{table}[{i + 1}].")
    if problems:
        raise ProvisionError("project.toml: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# identities


def identity_uri(kind: str, party_id: str | None = None) -> str:
    """The SAN URI naming a party: dpfed://site/<id>, dpfed://coordinator/<id>, dpfed://aggregator."""
    if kind == AGGREGATOR:
        return f"{URI_SCHEME}://{AGGREGATOR}"
    if kind not in (SITE, COORDINATOR) or not party_id:
        raise ValueError(f"no identity URI for {kind!r} {party_id!r}")
    return f"{URI_SCHEME}://{kind}/{party_id}"


def parse_identity_uri(uri: str) -> tuple[str, str] | None:
    """(kind, party_id) of a dpfed identity URI, or None if ``uri`` is not one."""
    prefix = f"{URI_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    rest = uri[len(prefix):]
    if rest == AGGREGATOR:
        return AGGREGATOR, AGGREGATOR
    kind, sep, party = rest.partition("/")
    if sep and kind in (SITE, COORDINATOR) and _NAME.match(party):
        return kind, party
    return None


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ProvisionError(f"{what} {name!r} must be 1-64 characters of letters, digits, "
                             "'.', '_' or '-', starting with a letter or digit (it names "
                             "folders and certificates)")
    return name


# ---------------------------------------------------------------------------------------------
# project.toml


@dataclass(frozen=True)
class Project:
    """What project.toml says: the federation and its parties."""

    federation: str
    aggregator_address: str                  # host:port that sites and coordinators dial
    listen: str                              # what the aggregator binds
    hostnames: tuple[str, ...] = ("localhost",)
    ip_addresses: tuple[str, ...] = ("127.0.0.1",)
    sites: tuple[str, ...] = ()
    coordinators: tuple[str, ...] = ()
    cert_days: int = DEFAULT_CERT_DAYS
    site_policy: dict = field(default_factory=lambda: dict(DEFAULT_POLICY))

    def with_sites(self, extra: list[str] | tuple[str, ...]) -> "Project":
        sites = list(self.sites)
        for s in extra:
            check_name(s, "site id")
            if s not in sites:
                sites.append(s)
        return Project(self.federation, self.aggregator_address, self.listen, self.hostnames,
                       self.ip_addresses, tuple(sites), self.coordinators, self.cert_days,
                       self.site_policy)


def _ids(raw, key: str, id_key: str) -> tuple[str, ...]:
    """``sites = ["a", "b"]`` or ``[[sites]] site_id = "a"``."""
    items = raw.get(key, [])
    if not isinstance(items, list):
        raise ProvisionError(f"project.toml: {key} must be a list")
    out = []
    for item in items:
        name = item.get(id_key) if isinstance(item, dict) else item
        check_name(name, f"{key} entry")
        if name in out:
            raise ProvisionError(f"project.toml: {key} lists {name!r} twice")
        out.append(name)
    return tuple(out)


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProvisionError(f"project.toml: aggregator.address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def project_from_dict(raw: dict) -> Project:
    _check_project_keys(raw)
    federation = raw.get("federation")
    if not isinstance(federation, str) or not federation.strip():
        raise ProvisionError("project.toml: `federation` (the federation's name) is missing")
    agg = raw.get("aggregator", {})
    if not isinstance(agg, dict):
        raise ProvisionError("project.toml: [aggregator] must be a table")
    address = agg.get("address", "localhost:50051")
    if not isinstance(address, str):
        raise ProvisionError("project.toml: aggregator.address must be a string host:port")
    host, port = _split_host_port(address)
    hostnames = list(agg.get("hostnames", ["localhost"]))
    ips = list(agg.get("ip_addresses", ["127.0.0.1"]))
    # The address the parties dial must be in the certificate, or their TLS check fails.
    if _is_ip(host):
        ips = ips if host in ips else [*ips, host]
    elif host not in hostnames:
        hostnames.append(host)
    for h in hostnames:
        if not isinstance(h, str) or not h or _is_ip(h):
            raise ProvisionError(f"project.toml: aggregator.hostnames entry {h!r} is not a DNS name")
    for ip in ips:
        if not isinstance(ip, str) or not _is_ip(ip):
            raise ProvisionError(f"project.toml: aggregator.ip_addresses entry {ip!r} is not an "
                                 "IP address")
    listen = agg.get("listen", f"0.0.0.0:{port}")
    _split_host_port(listen)
    sites = _ids(raw, "sites", "site_id")
    coordinators = _ids(raw, "coordinators", "coordinator_id")
    if not coordinators:
        raise ProvisionError("project.toml: list at least one coordinator (coordinators = "
                             '["coordinator"]): only coordinators start rounds')
    days = raw.get("cert_days", DEFAULT_CERT_DAYS)
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= CA_DAYS:
        raise ProvisionError(f"project.toml: cert_days must be an integer in 1..{CA_DAYS}")
    policy = dict(DEFAULT_POLICY)
    extra = raw.get("site_policy", {})
    if not isinstance(extra, dict) or not extra.keys() <= DEFAULT_POLICY.keys():
        raise ProvisionError(f"project.toml: [site_policy] may set {sorted(DEFAULT_POLICY)}")
    policy.update(extra)
    return Project(federation.strip(), address, listen, tuple(hostnames), tuple(ips), sites,
                   coordinators, days, policy)


def load_project(path: str | Path) -> Project:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProvisionError(f"{path}: project file not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProvisionError(f"{path}: {exc}") from None
    try:
        return project_from_dict(raw)
    except ProvisionError as exc:
        raise ProvisionError(str(exc).replace("project.toml", str(path), 1)) from None


# ---------------------------------------------------------------------------------------------
# files with owner-only permissions


def make_private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from the start (no window where it is world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


# ---------------------------------------------------------------------------------------------
# the certificate authority


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class _PublicOnly:
    """Stands in for a key pair in ``issue_for_key``: only the public half is ever needed."""
    key: object

    def public_key(self):
        return self.key


@dataclass(frozen=True)
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def federation(self) -> str:
        return self.cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value

    @classmethod
    def create(cls, federation: str) -> "CertificateAuthority":
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, federation),
                          x509.NameAttribute(NameOID.COMMON_NAME, f"{federation} dpfed CA")])
        now = _now()
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (x509.CertificateBuilder()
                .subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - _BACKDATE).not_valid_after(now + dt.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, key_cert_sign=True,
                                             crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(ski, critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def save(self, folder: Path) -> None:
        make_private_dir(folder)
        write_private(folder / "ca.key", _private_pem(self.key))
        (folder / "ca.pem").write_bytes(cert_pem(self.cert))

    @classmethod
    def load(cls, folder: Path) -> "CertificateAuthority":
        key_path, cert_path = folder / "ca.key", folder / "ca.pem"
        if not key_path.exists() or not cert_path.exists():
            raise ProvisionError(f"{folder}: the CA is incomplete (need ca.key and ca.pem); "
                                 "restore it from backup rather than making a new one, or every "
                                 "issued certificate stops working")
        mode = stat.S_IMODE(key_path.stat().st_mode)
        if mode & 0o077:
            raise ProvisionError(f"{key_path} is readable by others (mode {mode:o}); "
                                 f"run `chmod 600 {key_path}` and check who copied it")
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        if not isinstance(key, ec.EllipticCurvePrivateKey) or (
                key.public_key().public_numbers() != cert.public_key().public_numbers()):
            raise ProvisionError(f"{folder}: ca.key does not belong to ca.pem")
        return cls(key, cert)

    def issue(self, kind: str, party_id: str, *, days: int, dns_names=(), ip_addresses=()):
        """A TLS key and certificate for one party; returns (key PEM, certificate PEM).
        The central (demo) path: the CA generates the key. In production the party makes its
        own key and a certificate request (``make_request``), and ``issue_for_key`` signs it."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self.issue_for_key(kind, party_id, key.public_key(), days=days,
                                  dns_names=dns_names, ip_addresses=ip_addresses)
        return _private_pem(key), cert

    def issue_for_key(self, kind: str, party_id: str, public_key, *, days: int, dns_names=(),
                      ip_addresses=()) -> bytes:
        """The certificate (PEM) of ``public_key`` (an ECDSA P-256 public key) for one party."""
        if not isinstance(public_key, ec.EllipticCurvePublicKey) or \
                not isinstance(public_key.curve, ec.SECP256R1):
            raise ProvisionError("the TLS key must be ECDSA P-256 (what `dpfed csr` makes)")
        key = _PublicOnly(public_key)
        uri = identity_uri(kind, party_id)
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
        names += [x509.DNSName(h) for h in dns_names]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        # The aggregator is the only server; sites and coordinators only dial out.
        usage = ExtendedKeyUsageOID.SERVER_AUTH if kind == AGGREGATOR else ExtendedKeyUsageOID.CLIENT_AUTH
        now = _now()
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, self.federation),
                             x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
                             x509.NameAttribute(NameOID.COMMON_NAME, party_id)])
        cert = (x509.CertificateBuilder()
                .subject_name(subject).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - _BACKDATE).not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, key_cert_sign=False,
                                             crl_sign=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                    self.key.public_key()), critical=False)
                .sign(self.key, hashes.SHA256()))
        return cert_pem(cert)


def identities_of(cert: x509.Certificate) -> list[tuple[str, str]]:
    """The dpfed identities (kind, id) a certificate's SAN URIs name."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found = (parse_identity_uri(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier))
    return [f for f in found if f is not None]


# ---------------------------------------------------------------------------------------------
# config templates (the formats of docs/interfaces.md and what the loaders parse)


def _toml(v) -> str:
    import json
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise TypeError(type(v).__name__)


def _tls_table(name: str) -> str:
    return ("[tls]\n"
            'ca_cert = "tls/ca.pem"\n'
            f'cert = "tls/{name}.pem"\n'
            f'key = "tls/{name}.key"          # TLS private key (0600)\n')


def site_toml(project: Project, site_id: str, coordinators: list[str]) -> str:
    p = project.site_policy
    trusted = [f"keys/{c}.pub" for c in coordinators]
    return f"""\
# Site node of {site_id} in federation {project.federation!r} (made by dpfed provision).
#   dpfed site check --config site.toml     # validate config, keys and data; releases nothing
#   dpfed site serve --config site.toml
# Paths are relative to this file.
site_id = {_toml(site_id)}
aggregator = {_toml(project.aggregator_address)}   # dialled out; no inbound port is opened
state_db = "state/{site_id}.sqlite"   # the privacy ledger: back it up, never delete it
signing_key = "keys/{site_id}.key"     # Ed25519, signs every release (0600)

# Mutual TLS with the federation's CA; the certificate names dpfed://site/{site_id}.
{_tls_table(site_id)}
[data]
path = "data/CHANGE-ME.csv"   # your data file (.csv, .tsv or .parquet)
# id_column = "COSMIC_ID"

[policy]
# Only rounds signed by these coordinator keys are answered.
trusted_coordinators = {_toml(trusted)}
max_epsilon_per_round = {_toml(float(p["max_epsilon_per_round"]))}
total_epsilon = {_toml(float(p["total_epsilon"]))}     # lifetime budget; recorded in the ledger on first use
min_n = {_toml(int(p["min_n"]))}
allowed_targets = {_toml(list(p["allowed_targets"]))}
allowed_features = {_toml(list(p["allowed_features"]))}
"""


def _sites_block(site_id: str) -> str:
    return f'[[sites]]\nsite_id = {_toml(site_id)}\npublic_key = "keys/{site_id}.pub"\n'


def _coordinators_block(coord_id: str) -> str:
    return (f'[[coordinators]]\ncoordinator_id = {_toml(coord_id)}\n'
            f'public_key = "keys/{coord_id}.pub"\n')


def aggregator_toml(project: Project, sites: list[str], coordinators: list[str]) -> str:
    blocks = "\n".join([*(_sites_block(s) for s in sites),
                        *(_coordinators_block(c) for c in coordinators)])
    return f"""\
# Aggregator of federation {project.federation!r} (made by dpfed provision).
#   dpfed aggregator serve --config aggregator.toml
# Paths are relative to this file.
listen = {_toml(project.listen)}
state_db = "state/aggregator.sqlite"   # rounds, accepted contributions, nonces, results
max_clock_skew_s = 300

# Mutual TLS: only certificates of the federation's CA get in, and each request's signing key
# must belong to the party its certificate names. crl: the CA's revocation list (`dpfed
# provision revoke`); re-read when it changes, a revoked certificate is refused on every call.
{_tls_table("aggregator")}crl = "tls/crl.pem"
{blocks}"""


def coordinator_toml(project: Project, coord_id: str) -> str:
    return f"""\
# Coordinator {coord_id} of federation {project.federation!r} (made by dpfed provision).
#   dpfed round start --spec round.toml --config coordinator.toml --wait
#   dpfed sites list --config coordinator.toml
# Paths are relative to this file.
aggregator = {_toml(project.aggregator_address)}
coordinator_id = {_toml(coord_id)}
signing_key = "keys/{coord_id}.key"   # Ed25519, signs round specs (0600)

{_tls_table(coord_id)}"""


_START = {
    SITE: """\
# {name}: site kit of federation {federation!r}

This folder is what {name} runs. It holds private keys: move it only over a secure channel,
keep it readable by the service account alone (`chmod -R go-rwx`), and delete other copies.

| file | what |
|---|---|
| `site.toml` | the site's configuration: set `[data] path` and review `[policy]` |
| `keys/{name}.key` | Ed25519 signing key: signs every release (private, 0600) |
| `keys/{name}.pub` | its public half (registered at the aggregator) |
| `keys/<coordinator>.pub` | coordinators whose rounds this site may answer |
| `tls/{name}.pem`, `tls/{name}.key` | TLS certificate (`dpfed://site/{name}`) and key (0600) |
| `tls/ca.pem` | the federation's CA: the aggregator must present a certificate it signed |

1. `pip install "dpfed[site]"`
2. Put the data file in place and set `[data] path` in `site.toml` (and `[data.columns]` if the
   column names differ from the federation's).
3. `dpfed site check --config site.toml` (releases nothing)
4. `dpfed site serve --config site.toml` (or the systemd unit in deploy/systemd/). The site only
   dials out to {address}; it opens no inbound port.
5. `dpfed site ledger --config site.toml` shows the privacy budget spent. Back up `state/`.
""",
    AGGREGATOR: """\
# aggregator kit of federation {federation!r}

| file | what |
|---|---|
| `aggregator.toml` | configuration: listens on `{listen}`, registers the sites and coordinators |
| `keys/*.pub` | public signing keys of the registered sites and coordinators |
| `tls/aggregator.pem`, `tls/aggregator.key` | TLS certificate (`dpfed://aggregator`, DNS/IP names below) and key (0600) |
| `tls/ca.pem` | the federation's CA: only clients with a certificate it signed get in |

Certificate names: {names}. Sites and coordinators dial {address}.

1. `pip install "dpfed[aggregator]"`
2. `dpfed aggregator serve --config aggregator.toml` (or deploy/systemd/dpfed-aggregator.service)
3. Open port {port} to the hospitals. Back up `state/`.

A site added later (`dpfed provision --add-site NAME`) brings `keys/NAME.pub` and
`add-sites/NAME.toml`: append that block to `aggregator.toml` and restart.
""",
    COORDINATOR: """\
# {name}: coordinator kit of federation {federation!r}

| file | what |
|---|---|
| `coordinator.toml` | the connection: aggregator address, coordinator id, keys |
| `keys/{name}.key` | Ed25519 signing key: signs round specs (private, 0600) |
| `tls/{name}.pem`, `tls/{name}.key` | TLS certificate (`dpfed://coordinator/{name}`) and key (0600) |

1. `pip install "dpfed[aggregator]"` (or `dpfed` alone to start rounds with fixed bounds)
2. `dpfed sites list --config coordinator.toml`
3. `dpfed round start --spec round.toml --config coordinator.toml --wait`
""",
}


# ---------------------------------------------------------------------------------------------
# kits


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


def kit_dir(out: Path, kind: str, party_id: str) -> Path:
    if kind == AGGREGATOR:
        return out / "aggregator"
    return out / ("sites" if kind == SITE else "coordinators") / party_id


def public_dir(out: Path, kind: str) -> Path:
    return out / "public" / ("sites" if kind == SITE else "coordinators")


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
    kit.write("START.md", _START[kind].format(name=party_id, federation=project.federation,
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
    kit = _KitBuilder(kit_dir(out, AGGREGATOR, AGGREGATOR))
    names = dict(dns_names=project.hostnames, ip_addresses=project.ip_addresses)
    if request is None:
        tls_key, tls_cert = ca.issue(AGGREGATOR, AGGREGATOR, days=project.cert_days, **names)
        kit.write("tls/aggregator.key", tls_key, private=True)
    else:
        tls_cert = ca.issue_for_key(AGGREGATOR, AGGREGATOR, request.tls_public_key,
                                    days=project.cert_days, **names)
    kit.write("tls/aggregator.pem", tls_cert)
    kit.write("tls/ca.pem", cert_pem(ca.cert))
    if crl_path(out).exists():
        kit.write(f"tls/{CRL_NAME}", crl_path(out).read_bytes())
    for kind, ids in ((SITE, sites), (COORDINATOR, coordinators)):
        for i in ids:
            kit.write(f"keys/{i}.pub", (public_dir(out, kind) / f"{i}.pub").read_bytes())
    kit.write("aggregator.toml", aggregator_toml(project, sites, coordinators))
    names = ", ".join([*project.hostnames, *project.ip_addresses])
    kit.write("START.md", _START[AGGREGATOR].format(
        federation=project.federation, listen=project.listen, names=names,
        address=project.aggregator_address, port=project.listen.rsplit(":", 1)[1]))
    (out / "public" / "aggregator.pem").write_bytes(tls_cert)
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
    block = _sites_block(party_id) if kind == SITE else _coordinators_block(party_id)
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


def kit_tls(kit: Path, name: str):
    """The TlsFiles of a kit folder (dpfed.transport)."""
    from dpfed.transport import TlsFiles
    return TlsFiles(kit / "tls" / "ca.pem", kit / "tls" / f"{name}.pem", kit / "tls" / f"{name}.key")


def certificate_problems(tls, kind: str, party_id: str) -> list[str]:
    """What is wrong with a party's TLS files (dpfed.transport.TlsFiles): unreadable, not
    signed by the CA in the same kit, expired or not yet valid, naming another identity, or
    a key that does not belong to the certificate. Empty when all is well."""
    try:
        ca = x509.load_pem_x509_certificate(Path(tls.ca_cert).read_bytes())
        cert = x509.load_pem_x509_certificate(Path(tls.cert).read_bytes())
        key = serialization.load_pem_private_key(Path(tls.key).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        return [f"cannot read the TLS files: {exc}"]
    problems = []
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        problems.append(f"{tls.cert} is not signed by the CA in {tls.ca_cert}")
    now = _now()
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        problems.append(f"{tls.cert} is valid only from {cert.not_valid_before_utc:%Y-%m-%d} to "
                        f"{cert.not_valid_after_utc:%Y-%m-%d}")
    named = identities_of(cert)
    if named != [(kind, party_id)]:
        problems.append(f"{tls.cert} names {[identity_uri(*i) for i in named] or 'no dpfed identity'}, "
                        f"not {identity_uri(kind, party_id)}")
    if key.public_key().public_bytes(serialization.Encoding.DER,
                                     serialization.PublicFormat.SubjectPublicKeyInfo) != \
            cert.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo):
        problems.append(f"{tls.key} is not the key of {tls.cert}")
    return problems


def expiry_warning(cert_path, *, within_days: int = EXPIRY_WARNING_DAYS,
                   now: dt.datetime | None = None) -> str | None:
    """A warning when the certificate at ``cert_path`` expires within ``within_days`` (and has
    not yet expired: that is a problem, see certificate_problems); None otherwise."""
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    except (OSError, ValueError):
        return None
    now = now or _now()
    left = cert.not_valid_after_utc - now
    if dt.timedelta(0) <= left <= dt.timedelta(days=within_days):
        return (f"{cert_path} expires on {cert.not_valid_after_utc:%Y-%m-%d} (in {left.days} "
                f"day(s)): ask the federation's CA for a renewed certificate (dpfed provision "
                f"renew) before then, or this party can no longer connect")
    return None


# ---------------------------------------------------------------------------------------------
# certificate requests: the party makes its own keys, the CA signs (the production path)


CSR_SUFFIX = ".csr"


@dataclass(frozen=True)
class Request:
    """A party's certificate request as the CA receives it: the X.509 CSR (signed with the
    party's TLS key, naming its dpfed identity) and the public half of its Ed25519 signing key.
    Neither private key is in it."""

    kind: str
    party_id: str
    csr: x509.CertificateSigningRequest
    signing_public_pem: bytes

    @property
    def tls_public_key(self):
        return self.csr.public_key()


def make_request(kind: str, party_id: str, folder: str | Path, *, force: bool = False) -> dict:
    """At the party: its TLS key (ECDSA P-256) and Ed25519 signing key, made here and never sent,
    plus the request to send to the CA. Writes, in ``folder`` (a kit-shaped folder):

        tls/<id>.key            TLS private key (0600)          stays here
        keys/<id>.key, .pub     Ed25519 signing key (0600), public half (not the aggregator)
        request/<id>.csr        X.509 CSR naming dpfed://<kind>/<id>   send to the CA
        request/<id>.pub        the signing key's public half           send to the CA
    """
    if kind not in KINDS:
        raise ProvisionError(f"kind must be one of {', '.join(KINDS)}")
    party_id = AGGREGATOR if kind == AGGREGATOR else check_name(party_id, f"{kind} id")
    folder = Path(folder)
    tls_key_path = folder / "tls" / f"{party_id}.key"
    sign_key_path = folder / "keys" / f"{party_id}.key"
    # The aggregator signs nothing (it relays and sums): it has a TLS key only.
    for path in (tls_key_path, sign_key_path)[:1 if kind == AGGREGATOR else 2]:
        if path.exists() and not force:
            raise ProvisionError(f"{path} exists: a request for the key already there is "
                                 "`dpfed csr ... --reuse-key`; --force makes new keys")
    make_private_dir(folder)
    for sub in ("tls", "keys", "request"):
        make_private_dir(folder / sub)
    key = ec.generate_private_key(ec.SECP256R1())
    write_private(tls_key_path, _private_pem(key))
    csr_path = write_csr(kind, party_id, key, folder / "request")
    if kind == AGGREGATOR:
        return {"tls_key": tls_key_path, "signing_key": None, "csr": csr_path, "pub": None}
    signing = SigningKey.generate()
    signing.save(sign_key_path, folder / "keys" / f"{party_id}.pub")
    pub = folder / "request" / f"{party_id}.pub"
    pub.write_bytes(public_key_pem(signing.public_key))
    return {"tls_key": tls_key_path, "signing_key": sign_key_path, "csr": csr_path, "pub": pub}


def write_csr(kind: str, party_id: str, key, folder: Path) -> Path:
    """``folder/<id>.csr``: a CSR for ``key`` (a private key: the CSR is signed with it, which
    proves to the CA that the requester holds it) naming dpfed://<kind>/<id>."""
    uri = identity_uri(kind, party_id)
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
                                    x509.NameAttribute(NameOID.COMMON_NAME, party_id)]))
           .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]),
                          critical=False)
           .sign(key, hashes.SHA256()))
    path = folder / f"{party_id}{CSR_SUFFIX}"
    path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    return path


def request_for_existing_key(kind: str, party_id: str, tls_key_path: str | Path,
                             folder: str | Path) -> Path:
    """A CSR for a TLS key the party already has (renewing the certificate of the same key)."""
    key = serialization.load_pem_private_key(Path(tls_key_path).read_bytes(), password=None)
    make_private_dir(Path(folder))
    return write_csr(kind, AGGREGATOR if kind == AGGREGATOR else party_id, key, Path(folder))


def load_request(csr_path: str | Path, pub_path: str | Path | None = None,
                 *, need_pub: bool = True) -> Request:
    """Read and check a request: the CSR's signature (proof that the requester holds the key),
    exactly one dpfed identity, an ECDSA P-256 key; and the Ed25519 public key next to it
    (``<id>.pub``, or ``pub_path``)."""
    from dpfed.wire.signing import load_public_key
    csr_path = Path(csr_path)
    try:
        csr = x509.load_pem_x509_csr(csr_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"{csr_path}: not a PEM certificate request ({exc})") from None
    if not csr.is_signature_valid:
        raise ProvisionError(f"{csr_path}: the request's signature does not verify (it was not "
                             "signed with the key it asks a certificate for)")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        found = [parse_identity_uri(u) for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
    except x509.ExtensionNotFound:
        found = []
    found = [f for f in found if f is not None]
    if len(found) != 1:
        raise ProvisionError(f"{csr_path}: the request must name exactly one dpfed identity "
                             f"(dpfed://site/<id>, ...), it names {len(found)}")
    kind, party_id = found[0]
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ProvisionError(f"{csr_path}: the TLS key must be ECDSA P-256")
    pub = b""
    if need_pub and kind != AGGREGATOR:
        pub_path = Path(pub_path) if pub_path else csr_path.with_name(f"{party_id}.pub")
        try:
            pub = pub_path.read_bytes()
            load_public_key(pub)
        except (OSError, ValueError) as exc:
            raise ProvisionError(f"{pub_path}: the signing key's public half is missing or "
                                 f"unreadable ({exc}); send it with the request") from None
    return Request(kind, party_id, csr, pub)


# ---------------------------------------------------------------------------------------------
# the record of issued certificates, renewal and revocation


def issued_dir(out: Path) -> Path:
    return out / "public" / "issued"


def current_cert_path(out: Path, kind: str, party_id: str) -> Path:
    if kind == AGGREGATOR:
        return out / "public" / "aggregator.pem"
    return public_dir(out, kind) / f"{party_id}.pem"


def record_issued(out: Path, kind: str, party_id: str, pem: bytes) -> Path:
    """Every certificate ever issued, by serial: revoking a party revokes all of them."""
    cert = x509.load_pem_x509_certificate(pem)
    folder = issued_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{party_id}-{cert.serial_number:x}.pem"
    path.write_bytes(pem)
    return path


def _kind_of(out: Path, name: str) -> str:
    if name == AGGREGATOR:
        return AGGREGATOR
    kinds = [k for k in (SITE, COORDINATOR) if (public_dir(out, k) / f"{name}.pem").exists()]
    if not kinds:
        raise ProvisionError(f"{out}: no site or coordinator {name!r} was issued here "
                             "(public/ has no certificate of that name)")
    if len(kinds) > 1:
        raise ProvisionError(f"{name!r} is both a site and a coordinator; cannot tell which")
    return kinds[0]


def issued_certificates(out: Path, kind: str, party_id: str) -> list[x509.Certificate]:
    """Every certificate issued to the party: the record in public/issued/ and the current one
    (federations provisioned before the record existed have only the latter)."""
    certs = {}
    paths = list(issued_dir(out).glob(f"{kind}-{party_id}-*.pem")) if issued_dir(out).is_dir() else []
    current = current_cert_path(out, kind, party_id)
    if current.exists():
        paths.append(current)
    for path in paths:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        if identities_of(cert) == [(kind, party_id)]:
            certs[cert.serial_number] = cert
    return [certs[k] for k in sorted(certs)]


def renew(out: str | Path, name: str, *, days: int = DEFAULT_CERT_DAYS,
          request: Request | None = None) -> Path:
    """A new certificate for an issued party, valid ``days`` from now: for the key of its current
    certificate, or for the key of ``request`` (a new key, made at the party by ``dpfed csr``;
    it must name the same identity). Keeps the names (DNS/IP) of the current certificate.
    Writes ``out/renewed/<name>.pem`` (hand it to the party: it replaces tls/<name>.pem) and
    updates the record in public/. The old certificate stays valid until it expires unless
    revoked (``revoke(..., serial=...)``)."""
    out = Path(out)
    if not 1 <= days <= CA_DAYS:
        raise ProvisionError(f"days must be in 1..{CA_DAYS}")
    ca = CertificateAuthority.load(out / "ca")
    kind = _kind_of(out, name)
    current_path = current_cert_path(out, kind, name)
    if not current_path.exists():
        raise ProvisionError(f"{current_path}: no current certificate of {name!r} to renew")
    current = x509.load_pem_x509_certificate(current_path.read_bytes())
    if request is not None and (request.kind, request.party_id) != (kind, name):
        raise ProvisionError(f"the request names {identity_uri(request.kind, request.party_id)}, "
                             f"not {identity_uri(kind, name)}")
    key = request.tls_public_key if request is not None else current.public_key()
    san = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    pem = ca.issue_for_key(kind, name, key, days=days,
                           dns_names=san.get_values_for_type(x509.DNSName),
                           ip_addresses=[str(i) for i in san.get_values_for_type(x509.IPAddress)])
    record_issued(out, kind, name, current_path.read_bytes())   # the old one, if not yet recorded
    record_issued(out, kind, name, pem)
    current_path.write_bytes(pem)
    folder = out / "renewed"
    folder.mkdir(exist_ok=True)
    target = folder / f"{name}.pem"
    target.write_bytes(pem)
    return target


CRL_NAME = "crl.pem"
CRL_NEXT_UPDATE_DAYS = 30


def crl_path(out: Path) -> Path:
    return out / "public" / CRL_NAME


def write_crl(ca: CertificateAuthority, path: Path,
              revoked: dict[int, dt.datetime]) -> x509.CertificateRevocationList:
    """An X.509 CRL signed by the CA listing ``revoked`` (serial -> revocation time)."""
    now = _now()
    builder = (x509.CertificateRevocationListBuilder()
               .issuer_name(ca.cert.subject)
               .last_update(now - _BACKDATE)
               .next_update(now + dt.timedelta(days=CRL_NEXT_UPDATE_DAYS)))
    for serial, when in sorted(revoked.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build())
    crl = builder.sign(ca.key, hashes.SHA256())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)
    return crl


def load_crl(path: str | Path, ca_cert: x509.Certificate) -> x509.CertificateRevocationList:
    """The CRL at ``path``, checked against the CA (ProvisionError if not signed by it)."""
    try:
        crl = x509.load_pem_x509_crl(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ProvisionError(f"{path}: not a readable PEM revocation list ({exc})") from None
    if crl.issuer != ca_cert.subject or not crl.is_signature_valid(ca_cert.public_key()):
        raise ProvisionError(f"{path}: the revocation list is not signed by the federation's CA")
    return crl


def revoke(out: str | Path, name: str, *, serial: int | None = None) -> tuple[list[int], Path]:
    """Revoke every certificate issued to ``name`` (or only the one with ``serial``, e.g. the one
    a renewal replaced) and re-sign ``out/public/crl.pem``. Returns the serials newly revoked
    and the CRL's path: copy it to the aggregator (its ``[tls] crl``), which re-reads it when it
    changes and refuses every call over a revoked certificate."""
    out = Path(out)
    ca = CertificateAuthority.load(out / "ca")
    kind = _kind_of(out, name)
    certs = issued_certificates(out, kind, name)
    serials = [c.serial_number for c in certs]
    if serial is not None:
        if serial not in serials:
            raise ProvisionError(f"no certificate with serial {serial:x} was issued to {name!r} "
                                 f"(issued: {', '.join(f'{s:x}' for s in serials) or 'none'})")
        serials = [serial]
    path = crl_path(out)
    revoked: dict[int, dt.datetime] = {}
    if path.exists():
        for entry in load_crl(path, ca.cert):
            revoked[entry.serial_number] = entry.revocation_date_utc
    new = [s for s in serials if s not in revoked]
    now = _now()
    revoked.update({s: now for s in new})
    write_crl(ca, path, revoked)
    return new, path
