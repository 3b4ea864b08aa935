"""The coordinator's client of the aggregator (docs/interfaces.md): sign and start rounds,
follow them, fetch results."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import grpc

from dpfed import exitcodes
from dpfed.transport import TlsFiles, client_channel
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.signing import SigningKey, key_id, load_public_key

FINAL_STATES = (pb.RoundStatus.DONE, pb.RoundStatus.FAILED)


class KeyPinError(ValueError):
    """The coordinator refuses to sign a secure round spec: it cannot pin an invited site's
    identity key from its own records, or the aggregator reports another key than the record
    (docs/security.md, "Identity keys relayed by the aggregator"), or it has no record of the
    aggregator's own identity key. ``str`` names the site(s) or the aggregator's key;
    ``exit_code`` is what ``dpfed round start`` exits with (dpfed.exitcodes)."""

    def __init__(self, message: str, exit_code: int = exitcodes.REFUSED):
        super().__init__(message)
        self.exit_code = exit_code


def load_site_keys(folder: str | Path) -> dict[str, str]:
    """The coordinator's record of the sites' identity keys: site id -> key id of the Ed25519
    public key in ``folder/<site_id>.pub``. ``folder`` is the CA's ``public/sites/`` (what
    ``dpfed provision`` records for every site it issued) or a copy of its ``.pub`` files;
    other files (the ``.pem`` certificates) are ignored. ValueError names what is wrong."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"site_keys names {str(folder)!r}, which is not a folder (expected the "
                         f"CA's public/sites/ from `dpfed provision`, or a copy of its .pub files)")
    records = {}
    for path in sorted(folder.glob("*.pub")):
        try:
            records[path.stem] = key_id(load_public_key(path))
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"site_keys: {path} is not an Ed25519 public key: {exc}") from None
    if not records:
        raise ValueError(f"site_keys: {folder} holds no <site_id>.pub file")
    return records


def load_aggregator_key(path: str | Path) -> str:
    """The coordinator's record of the aggregator's identity key: the key id of the Ed25519
    public key in ``path``, the CA's ``public/aggregator.pub`` (what ``dpfed provision``
    records when it issues the aggregator) or a copy of it. ValueError says what is wrong."""
    path = Path(path)
    try:
        return key_id(load_public_key(path))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"aggregator_key: {path} is not an Ed25519 public key (expected the "
                         f"CA's public/aggregator.pub from `dpfed provision`): {exc}") from None


class Coordinator:
    def __init__(self, address: str, signing_key: SigningKey | str | Path | None,
                 coordinator_id: str, tls: TlsFiles | None = None, *, timeout_s: float = 30.0,
                 server_name: str | None = None,
                 site_keys: Mapping[str, str] | str | Path | None = None,
                 aggregator_key=None):
        if signing_key is not None and not isinstance(signing_key, SigningKey):
            signing_key = SigningKey.load(signing_key)
        self.signing_key = signing_key
        # The coordinator's own record of the sites' identity keys (site id -> key id): the
        # pins of a secure round's spec. A folder (load_site_keys) or a mapping; None: no
        # record, so no secure round can be signed.
        if site_keys is not None and not isinstance(site_keys, Mapping):
            site_keys = load_site_keys(site_keys)
        self.site_records = None if site_keys is None else dict(site_keys)
        # The coordinator's own record of the aggregator's identity key (its key id): the pin
        # of a secure round's aggregator_key_id. The key id itself (str), the Path of a .pub
        # file (load_aggregator_key) or an Ed25519 public key; None: no record, so no secure
        # round can be signed.
        if isinstance(aggregator_key, Path):
            aggregator_key = load_aggregator_key(aggregator_key)
        elif aggregator_key is not None and not isinstance(aggregator_key, str):
            aggregator_key = key_id(aggregator_key)
        self.aggregator_record = aggregator_key or None
        self.coordinator_id = coordinator_id
        self.timeout_s = timeout_s
        # Mutual TLS with the federation's CA (dpfed provision); ``server_name``: the name in
        # the aggregator's certificate when it differs from the host in ``address``.
        self.channel = client_channel(address, tls, server_name=server_name)
        self.stub = pb_grpc.AggregatorStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def sign_spec(self, spec: pb.RoundSpec) -> pb.SignedEnvelope:
        if self.signing_key is None:
            raise ValueError("a signing key is needed to start rounds")
        spec = pb.RoundSpec.FromString(spec.SerializeToString())
        spec.coordinator_id = self.coordinator_id
        if not spec.created_unix_ms:
            spec.created_unix_ms = int(time.time() * 1000)
        return self.signing_key.sign(spec)

    def start_round(self, spec: pb.RoundSpec) -> pb.RoundStatus:
        """Sign and start ``spec``. quorum 0 (round.toml without a quorum) means every invited
        site: the sites listed, or every site registered at the aggregator (asked here). A
        secure spec first gets its invited sites and their key pins from the coordinator's
        records (``pin_site_keys``), and the aggregator's key pin from its record
        (``pin_aggregator_key``; KeyPinError: nothing is signed)."""
        if spec.aggregation == "secure":
            spec = self.pin_site_keys(spec)
            spec = self.pin_aggregator_key(spec)
        if spec.quorum == 0:
            spec = pb.RoundSpec.FromString(spec.SerializeToString())
            spec.quorum = len(spec.sites) or len(self.list_sites())
        return self.stub.StartRound(self.sign_spec(spec), timeout=self.timeout_s)

    def pin_site_keys(self, spec: pb.RoundSpec) -> pb.RoundSpec:
        """A copy of the secure ``spec`` that names its invited sites (sorted; with ``sites``
        empty: every site of the coordinator's records) and pins each one's identity key id
        from those records (``site_key_ids``), never from the aggregator: the aggregator relays
        the keys the sites use, so it must not choose them (method.md section 12). ListSites is
        asked only to compare: a site whose listed key id differs from the record, or a site
        without a record, raises KeyPinError naming it (exit 4), as does a ``site_key_ids``
        given in ``spec`` that differs from the record; a coordinator without records raises
        it with exit 2 (coordinator.toml needs ``site_keys``). A key id the aggregator hides
        from this coordinator (the site does not trust it) is not compared: the pin is the
        record either way, and the aggregator and every site check it."""
        records = self.site_records
        if records is None:
            raise KeyPinError("a secure round pins every invited site's identity key from the "
                              "coordinator's own records, and this coordinator has none: set "
                              "site_keys in coordinator.toml (or --site-keys) to the CA's "
                              "public/sites/ folder from `dpfed provision`, or a copy of its "
                              ".pub files", exitcodes.USAGE)
        spec = pb.RoundSpec.FromString(spec.SerializeToString())
        sites = sorted(spec.sites) if spec.sites else sorted(records)
        unknown = [s for s in sites if s not in records]
        if unknown:
            raise KeyPinError(f"refusing to sign secure round {spec.round_id!r}: no record of "
                              f"the identity key of site(s) {', '.join(unknown)} in the "
                              f"coordinator's site_keys; a key the aggregator names for them "
                              f"cannot be checked")
        given = [s for s in sites if s in spec.site_key_ids
                 and spec.site_key_ids[s] != records[s]]
        if given:
            raise KeyPinError(f"refusing to sign secure round {spec.round_id!r}: the spec pins "
                              f"another key than the coordinator's record for site(s) "
                              f"{', '.join(given)}")
        listed = {s.site_id: s.key_id for s in self.list_sites()}
        wrong = [s for s in sites if listed.get(s) and listed[s] != records[s]]
        if wrong:
            raise KeyPinError(
                f"refusing to sign secure round {spec.round_id!r}: the aggregator lists another "
                f"identity key than the coordinator's record for site(s) "
                + "; ".join(f"{s} (aggregator: {listed[s]}, record: {records[s]})"
                            for s in wrong)
                + ". Check the aggregator's registration of these sites before any round")
        del spec.sites[:]
        spec.sites.extend(sites)
        spec.site_key_ids.clear()
        spec.site_key_ids.update({s: records[s] for s in sites})
        return spec

    def pin_aggregator_key(self, spec: pb.RoundSpec) -> pb.RoundSpec:
        """A copy of the secure ``spec`` that pins the aggregator's identity key id from the
        coordinator's own record (``aggregator_key_id``): the aggregator signs every
        secure-aggregation message it sends with that key, and each site refuses a round whose
        "keys" notice relays another one (docs/security.md). A coordinator without the record
        raises KeyPinError with exit 2 (coordinator.toml needs ``aggregator_key``); a spec
        that already pins another key id than the record raises it with exit 4."""
        record = self.aggregator_record
        if record is None:
            raise KeyPinError(f"refusing to sign secure round {spec.round_id!r}: a secure round "
                              f"pins the aggregator's identity key from the coordinator's own "
                              f"record, and this coordinator has none: set aggregator_key in "
                              f"coordinator.toml (or --aggregator-key) to the CA's "
                              f"public/aggregator.pub from `dpfed provision`", exitcodes.USAGE)
        if spec.aggregator_key_id and spec.aggregator_key_id != record:
            raise KeyPinError(f"refusing to sign secure round {spec.round_id!r}: the spec pins "
                              f"aggregator key {spec.aggregator_key_id}, the coordinator's "
                              f"record is {record}")
        spec = pb.RoundSpec.FromString(spec.SerializeToString())
        spec.aggregator_key_id = record
        return spec

    def status(self, round_id: str) -> pb.RoundStatus:
        return self.stub.GetRound(pb.RoundQuery(round_id=round_id), timeout=self.timeout_s)

    def wait(self, round_id: str, timeout_s: float | None = None, *,
             poll_s: float = 0.2) -> pb.RoundStatus:
        """Poll until the round is DONE or FAILED; returns the last status (maybe still open
        when ``timeout_s`` ran out)."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.status(round_id)
            if status.state in FINAL_STATES or (end is not None and time.monotonic() >= end):
                return status
            time.sleep(poll_s)

    def result(self, round_id: str) -> pb.RoundResult:
        return self.stub.GetResult(pb.RoundQuery(round_id=round_id), timeout=self.timeout_s)

    def list_rounds(self, *, limit: int = 0, before: str = "") -> pb.ListRoundsReply:
        """Summaries of the aggregator's rounds, newest first (ListRounds)."""
        return self.stub.ListRounds(pb.ListRoundsRequest(limit=limit, before=before),
                                    timeout=self.timeout_s)

    def list_sites(self) -> list[pb.SiteInfo]:
        return list(self.stub.ListSites(pb.ListSitesRequest(), timeout=self.timeout_s).sites)

    def site_spending(self, site_id: str) -> pb.SiteSpending:
        """What ``site_id`` spent, round by round, as the aggregator recorded it."""
        return self.stub.GetSiteSpending(pb.SiteQuery(site_id=site_id), timeout=self.timeout_s)


def beta_draws(result: pb.RoundResult):
    """The posterior draws of a RoundResult as a (draws x dim) float64 array."""
    import numpy as np
    return np.frombuffer(result.beta_draws, dtype="<f8").reshape(result.draws, result.dim)


def is_unavailable(exc: grpc.RpcError) -> bool:
    return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
