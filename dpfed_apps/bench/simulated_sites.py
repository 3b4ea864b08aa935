"""Simulated sites for the round and load benchmarks (bench_round.py, bench_load.py).

One real aggregator in its own process (spawned, so it competes for the cores like a real
deployment on the same machine would) and N sites that live in the benchmark's process as
lightweight gRPC clients. Every site has its own Ed25519 key and signs its own contribution
before the clock starts: sites sign in parallel in reality, so one process signing 1000 in
series would time this machine, not the federation. The signed envelopes are serialised once,
up front, and sent as bytes through a generic stub, because the client shares the machine's
two cores with the aggregator and every millisecond it spends counts against the round.

With ``tls=True`` the federation is provisioned with dpfed_apps.ca into a temporary folder
(CA, one kit per site and coordinator, the aggregator's own aggregator.toml) and every call
uses mutual TLS as in production: each site dials with its own certificate on its own
connection, so the aggregator's key-owner = certificate-identity check runs on every call.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import shutil
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CONTRIBUTE = "/dpfed.v1.Aggregator/Contribute"
SEND_PHASE = "/dpfed.v1.Aggregator/SendPhase"
BENCH_COORDINATOR = "bench"


def aggregator_process(raw_config: dict, base_dir: str, port_queue, stop_event) -> None:
    """Target of the aggregator process: serve ``raw_config`` until ``stop_event``."""
    import logging
    logging.basicConfig(level=logging.ERROR)
    from aggregator.config import config_from_dict
    from aggregator.server import AggregatorServer
    server = AggregatorServer(config_from_dict(raw_config, base_dir))
    port_queue.put(server.start())
    stop_event.wait()
    server.stop(0)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux /proc; None elsewhere)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def process_kib(pid: int, field_name: str) -> int:
    """A memory figure of ``/proc/<pid>/status`` (VmRSS, VmHWM, ...) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


def release(d: int, n: int, rng):
    """A release-shaped Statistics value (random, exactly symmetric); not private data."""
    from dpfed.statistics import Statistics
    a = rng.normal(size=(d, d))
    return Statistics(np.triu(a) + np.triu(a, 1).T, rng.normal(size=d),
                      float(abs(rng.normal()) + n), n)


BENCH_SPLIT = (0.35, 0.6, 0.03, 0.02)  # add/remove (the default relation)


def sign_contributions(site_keys: dict, round_id: str, spec_digest: str, dim: int,
                       rng) -> list[bytes]:
    """One serialised SignedEnvelope per site (in ``site_keys`` order): a release-shaped
    Contribution of n = 100 and epsilon 1 to ``round_id``, signed with the site's own key,
    declaring the noise of the benchmark's spec (eps 1, Bx 0.5, By 1, ``BENCH_SPLIT``)."""
    from dpfed.noise import to_proto
    from dpfed.sensitivity import expected_noise
    from dpfed.v1 import dpfed_pb2 as pb
    noise = to_proto(expected_noise(dim, 1.0, 0.5, 1.0, BENCH_SPLIT))
    out = []
    for site, key in site_keys.items():
        stats = release(dim, 100, rng)
        out.append(key.sign(pb.Contribution(
            round_id=round_id, site_id=site, statistics=stats.to_bytes(), n=stats.n,
            epsilon_spent=1.0, spec_digest=spec_digest, timestamp_unix_ms=int(time.time() * 1000),
            nonce=secrets.token_hex(16), noise=noise)).SerializeToString())
    return out


def sign_consents(site_keys: dict, round_id: str, spec_digest: str) -> list[bytes]:
    """One serialised signed consent (PhaseMessage) per site, in ``site_keys`` order."""
    from dpfed.v1 import dpfed_pb2 as pb
    return [key.sign(pb.PhaseMessage(
        round_id=round_id, site_id=site, spec_digest=spec_digest, phase="consent",
        timestamp_unix_ms=int(time.time() * 1000), nonce=secrets.token_hex(16))
    ).SerializeToString() for site, key in site_keys.items()]


@dataclass
class Federation:
    """A running aggregator, its round spec and the sites' pre-serialised contributions."""

    proc: mp.Process
    stop_event: object
    address: str
    round_id: str
    site_ids: list[str]
    spec_envelope: object                 # pb.SignedEnvelope, signed by the coordinator
    contributions: list[bytes]            # serialised SignedEnvelope of site i
    folder: Path
    tls_root: Path | None = None          # dpfed_apps.ca output, with tls=True
    consents: list[bytes] = field(default_factory=list)   # serialised consent of site i
    _channels: list = field(default_factory=list)
    site_keys: dict = field(default_factory=dict)          # site id -> SigningKey
    spec: object = None                                    # the pb.RoundSpec
    aggregator_key: object = None     # SigningKey: signs the aggregator's secagg messages

    @property
    def tls(self) -> bool:
        return self.tls_root is not None

    def _channel(self, kind: str, party: str):
        import grpc

        from dpfed_apps.ca import kit_dir, kit_tls
        from dpfed.transport import CHANNEL_OPTIONS
        # Own subchannel pool: otherwise gRPC shares one connection between equal channels.
        options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        if self.tls_root is None:
            channel = grpc.insecure_channel(self.address, options=options)
        else:
            ca, cert, key = kit_tls(kit_dir(self.tls_root, kind, party), party).read()
            creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                                 certificate_chain=cert)
            channel = grpc.secure_channel(self.address, creds, options=options)
        self._channels.append(channel)
        return channel

    def coordinator_stub(self):
        """A typed stub on a connection of the coordinator (its certificate with TLS)."""
        import grpc

        from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
        channel = self._channel("coordinator", BENCH_COORDINATOR)
        grpc.channel_ready_future(channel).result(timeout=60)
        return pb_grpc.AggregatorStub(channel)

    def contribute_callables(self, connections: int) -> list[tuple]:
        """One (Contribute, SendPhase) pair of callables per site taking the serialised
        envelope as is. Plaintext: the sites share ``connections`` HTTP/2 connections; TLS:
        each site has its own connection and certificate (as it would in production), all
        connected up front."""
        import grpc

        from dpfed.v1 import dpfed_pb2 as pb

        def calls_on(channel):
            return (channel.unary_unary(CONTRIBUTE, request_serializer=None,
                                        response_deserializer=pb.ContributeReply.FromString),
                    channel.unary_unary(SEND_PHASE, request_serializer=None,
                                        response_deserializer=pb.Ack.FromString))

        if self.tls_root is None:
            channels = [self._channel("site", "") for _ in range(connections)]
            shared = [calls_on(c) for c in channels]
            calls = [shared[i % connections] for i in range(len(self.site_ids))]
        else:
            channels = [self._channel("site", s) for s in self.site_ids]
            calls = [calls_on(c) for c in channels]
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=120)
        return calls

    def stop(self) -> None:
        """Close the connections, stop the aggregator and delete the temporary folder (its
        store and, with TLS, the provisioned private keys)."""
        for channel in self._channels:
            channel.close()
        self.stop_event.set()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _plaintext_parties(site_ids: list[str], folder: Path, raw_extra: dict):
    from dpfed.wire.signing import SigningKey, public_key_pem
    site_keys = {s: SigningKey.generate() for s in site_ids}
    coordinator = SigningKey.generate()
    aggregator = SigningKey.generate()     # signs the aggregator's secure-aggregation messages
    aggregator.save(folder / "aggregator.key")
    raw = {"listen": "127.0.0.1:0", "state_db": "bench.sqlite", "insecure": True,
           "signing_key": "aggregator.key",
           "sites": [{"site_id": s, "public_key": public_key_pem(k.public_key).decode()}
                     for s, k in site_keys.items()],
           "coordinators": [{"coordinator_id": BENCH_COORDINATOR,
                             "public_key": public_key_pem(coordinator.public_key).decode()}],
           **raw_extra}
    return raw, folder, site_keys, coordinator, aggregator


def _provisioned_parties(site_ids: list[str], folder: Path, raw_extra: dict):
    """dpfed_apps.ca's CA and kits; the aggregator runs its kit's own aggregator.toml."""
    from dpfed_apps.ca import kit_dir, project_from_dict, provision
    from dpfed.wire.signing import SigningKey
    root = folder / "federation"
    provision(project_from_dict({"federation": "bench", "sites": site_ids,
                                 "coordinators": [BENCH_COORDINATOR],
                                 "aggregator": {"address": "127.0.0.1:50051"}}), root)
    kit = kit_dir(root, "aggregator", "aggregator")
    raw = tomllib.loads((kit / "aggregator.toml").read_text())
    raw.update(listen="127.0.0.1:0", state_db=str(folder / "bench.sqlite"), **raw_extra)
    site_keys = {s: SigningKey.load(kit_dir(root, "site", s) / "keys" / f"{s}.key")
                 for s in site_ids}
    coordinator = SigningKey.load(kit_dir(root, "coordinator", BENCH_COORDINATOR) / "keys"
                                  / f"{BENCH_COORDINATOR}.key")
    aggregator = SigningKey.load(kit / raw["signing_key"])
    return raw, kit, site_keys, coordinator, aggregator


def start_federation(sites: int, dim: int, *, round_id: str = "bench-1", workers: int = 16,
                     tls: bool = False, seed: int = 0, config: dict | None = None,
                     site_id_format: str = "site-{:04d}", spec_fields: dict | None = None
                     ) -> Federation:
    """Start the aggregator (fit skipped) and prepare ``sites`` signed contributions of
    dimension ``dim`` to a round of quorum ``sites`` (not started: the caller times that).
    ``spec_fields`` override fields of the round spec; with aggregation = "secure" nothing is
    precomputed here (benchmarks/secure_sites.py plans the secure messages)."""
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.canonical import digest

    rng = np.random.default_rng(seed)
    site_ids = [site_id_format.format(i) for i in range(sites)]
    folder = Path(tempfile.mkdtemp(prefix="dpfed-bench-"))
    raw_extra = {"skip_fit": True, "max_workers": workers, "grace_s": 0, **(config or {})}
    make = _provisioned_parties if tls else _plaintext_parties
    raw, base_dir, site_keys, coordinator, aggregator = make(site_ids, folder, raw_extra)
    ctx = mp.get_context("spawn")
    port_queue, stop_event = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=aggregator_process, args=(raw, str(base_dir), port_queue,
                                                        stop_event))
    proc.start()
    try:
        port = port_queue.get(timeout=300)
        now = int(time.time() * 1000)
        fields = dict(round_id=round_id, coordinator_id=BENCH_COORDINATOR, target="y",
                      feature_names=[f"x{i}" for i in range(dim)], epsilon=1.0,
                      x_bound=0.5, y_bound=1.0, budget_split=list(BENCH_SPLIT),
                      quorum=sites, deadline_unix_ms=now + 600_000, created_unix_ms=now,
                      fit_method="laplace")
        spec = pb.RoundSpec(**{**fields, **(spec_fields or {})})
        if spec.aggregation == "secure" and not spec.site_key_ids:
            # What coordinator.client.Coordinator.pin_site_keys signs: the invited sites and
            # their key ids from the coordinator's records (here: the keys made above).
            invited = sorted(spec.sites or site_ids)
            del spec.sites[:]
            spec.sites.extend(invited)
            spec.site_key_ids.update({s: site_keys[s].key_id for s in spec.sites})
        if spec.aggregation == "secure" and not spec.aggregator_key_id:
            # ... and Coordinator.pin_aggregator_key: the aggregator's key id from its record.
            spec.aggregator_key_id = aggregator.key_id
        spec_envelope = coordinator.sign(spec)
        spec_digest = digest(spec_envelope.payload)
        secure = spec.aggregation == "secure"
        contributions = [] if secure else sign_contributions(site_keys, round_id, spec_digest,
                                                             dim, rng)
        consents = [] if secure else sign_consents(site_keys, round_id, spec_digest)
    except BaseException:
        stop_event.set()
        proc.join(30)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Federation(proc, stop_event, f"127.0.0.1:{port}", round_id, site_ids, spec_envelope,
                      contributions, folder, folder / "federation" if tls else None,
                      consents=consents, site_keys=site_keys, spec=spec,
                      aggregator_key=aggregator)
