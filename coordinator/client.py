"""The coordinator's client of the aggregator (docs/interfaces.md): sign and start rounds,
follow them, fetch results."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from dpfed.transport import TlsFiles, client_channel
from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.signing import SigningKey

FINAL_STATES = (pb.RoundStatus.DONE, pb.RoundStatus.FAILED)


class Coordinator:
    def __init__(self, address: str, signing_key: SigningKey | str | Path | None,
                 coordinator_id: str, tls: TlsFiles | None = None, *, timeout_s: float = 30.0,
                 server_name: str | None = None):
        if signing_key is not None and not isinstance(signing_key, SigningKey):
            signing_key = SigningKey.load(signing_key)
        self.signing_key = signing_key
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
        site: the sites listed, or every site registered at the aggregator (asked here)."""
        if spec.quorum == 0:
            spec = pb.RoundSpec.FromString(spec.SerializeToString())
            spec.quorum = len(spec.sites) or len(self.list_sites())
        if spec.aggregation == "secure" and not spec.site_key_ids:
            spec = pb.RoundSpec.FromString(spec.SerializeToString())
            spec.site_key_ids.update(self.site_key_ids(spec.sites))
        return self.stub.StartRound(self.sign_spec(spec), timeout=self.timeout_s)

    def site_key_ids(self, sites=()) -> dict[str, str]:
        """site id -> key id of its identity key, for ``sites`` (default: every site), from
        ListSites: what a secure round's spec pins (docs/security.md, "Secure rounds"). The
        figures come from the aggregator at round start; compare them with the provisioning
        record (dpfed provision's public/ folder) to take the aggregator out of the trust.
        Empty (nothing pinned) when a site's key id is not visible to this coordinator."""
        listed = {s.site_id: s.key_id for s in self.list_sites()}
        wanted = list(sites) or sorted(listed)
        if not all(listed.get(s) for s in wanted):
            return {}
        return {s: listed[s] for s in wanted}

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
