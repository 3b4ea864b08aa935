"""A federation for secure-round tests: a real aggregator gRPC server (in this process, or a
real ``dpfed aggregator serve`` process), K real SiteNode objects with their own data, keys
and ledgers, and either real SiteClient threads (``start_clients``) or a step-by-step driver
of the sites (``SiteDriver``) that the test advances phase by phase over real gRPC.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from dpfed.v1 import dpfed_pb2 as pb
from dpfed.v1 import dpfed_pb2_grpc as pb_grpc
from dpfed.wire.canonical import parse_canonical
from dpfed.wire.signing import SigningKey

FEATURES = ["g1", "g2", "g3"]
TARGET = "drug"
EPSILON = 1.0


def write_data(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = ["id," + ",".join(FEATURES) + "," + TARGET]
    for i in range(n):
        x = rng.normal(size=len(FEATURES))
        rows.append(f"{seed}-{i}," + ",".join(f"{v:.4f}" for v in x)
                    + f",{x.sum() + rng.normal():.4f}")
    path.write_text("\n".join(rows) + "\n")


class SecureFed:
    """Files of K sites and an aggregator; ``start_aggregator`` (in-process) or an external
    one at ``address``; ``node(site)`` gives a SiteNode over the site's files."""

    def __init__(self, tmp: Path, n_sites: int = 4, *, rows: int = 120,
                 max_noise_threshold: int | None = None, total_epsilon: float = 5.0,
                 policy_extra: dict | None = None):
        self.tmp = Path(tmp)
        self.sites = [f"site-{chr(97 + i)}" for i in range(n_sites)]
        self.coordinator_key = SigningKey.generate()
        self.coordinator_key.save(self.tmp / "coord.key", self.tmp / "coord.pub")
        # The aggregator's identity key (aggregator.toml signing_key): it signs every secagg
        # message it sends; the coordinator pins its key id from aggregator.pub.
        self.aggregator_key = SigningKey.generate()
        self.aggregator_key.save(self.tmp / "aggregator.key", self.tmp / "aggregator.pub")
        self.site_keys = {}
        for i, s in enumerate(self.sites):
            key = SigningKey.generate()
            key.save(self.tmp / f"{s}.key", self.tmp / f"{s}.pub")
            self.site_keys[s] = key
            write_data(self.tmp / f"{s}.csv", rows + 10 * i, seed=i + 1)
        self.max_t = max_noise_threshold or n_sites
        self.total_epsilon = total_epsilon
        self.policy_extra = dict(policy_extra or {})   # more site.toml [policy] keys
        self.raw = {"listen": "127.0.0.1:0", "state_db": "agg.sqlite", "insecure": True,
                    "max_clock_skew_s": 300, "grace_s": 0.2, "skip_fit": True,
                    "signing_key": "aggregator.key",
                    "sites": [{"site_id": s, "public_key": f"{s}.pub"} for s in self.sites],
                    "coordinators": [{"coordinator_id": "coord", "public_key": "coord.pub"}]}
        self.server = None
        self.address = None
        self.clients: dict[str, tuple] = {}
        self.nodes: dict[str, object] = {}

    # -- aggregator ----------------------------------------------------------------------------
    def start_aggregator(self, **extra):
        from aggregator.config import config_from_dict
        from aggregator.server import AggregatorServer
        self.server = AggregatorServer(config_from_dict({**self.raw, **extra}, self.tmp))
        self.address = f"127.0.0.1:{self.server.start()}"
        return self.server

    @property
    def manager(self):
        return self.server.manager

    def coordinator(self):
        from coordinator.client import Coordinator
        return Coordinator(self.address, self.coordinator_key, "coord", timeout_s=10,
                           site_keys=self.site_records(),
                           aggregator_key=self.aggregator_key.key_id)

    def site_records(self) -> dict[str, str]:
        """The coordinator's record of the sites' identity keys (site id -> key id)."""
        return {s: k.key_id for s, k in self.site_keys.items()}

    def stub(self):
        return pb_grpc.AggregatorStub(grpc.insecure_channel(self.address))

    # -- sites ---------------------------------------------------------------------------------
    def write_config(self, site: str) -> Path:
        path = self.tmp / f"{site}.toml"
        path.write_text(f"""
site_id = "{site}"
aggregator = "{self.address or '127.0.0.1:1'}"
state_db = "{site}.ledger.sqlite"
signing_key = "{site}.key"
insecure = true

[data]
path = "{site}.csv"
id_column = "id"

[policy]
trusted_coordinators = ["coord.pub"]
max_epsilon_per_round = 2.0
total_epsilon = {self.total_epsilon}
min_n = 20
max_noise_threshold = {self.max_t}
""" + "".join(f"{k} = {v!r}\n" for k, v in self.policy_extra.items()))
        return path

    def node(self, site: str):
        from site_node.config import load_config
        from site_node.node import SiteNode
        if site not in self.nodes:
            self.nodes[site] = SiteNode(load_config(self.write_config(site)))
        return self.nodes[site]

    def ledger_path(self, site: str) -> Path:
        return self.tmp / f"{site}.ledger.sqlite"

    def start_clients(self, sites=None) -> None:
        """A real SiteClient thread per site (quick retries so tests stay short)."""
        from site_node.client import Backoff, SiteClient
        for s in sites or self.sites:
            client = SiteClient(self.node(s), rpc_timeout_s=10, max_attempts=3,
                                reconnect=Backoff(0.05, 0.3), retry_base_s=0.05,
                                retry_cap_s=0.2)
            thread = threading.Thread(target=client.run, daemon=True, name=f"client-{s}")
            thread.start()
            self.clients[s] = (client, thread)

    def stop_client(self, site: str) -> None:
        client, thread = self.clients.pop(site)
        client.stop()
        thread.join(10)

    def stop(self) -> None:
        for s in list(self.clients):
            self.stop_client(s)
        if self.server is not None and self.server.server is not None:
            self.server.stop(0)

    # -- rounds --------------------------------------------------------------------------------
    def spec(self, round_id: str = "sec-1", *, t: int = 2, quorum: int = 2, rows: int = 1000,
             deadline_s: float = 60, consent_s: float | None = None, colluders: int = 0,
             sites=None, **kw) -> pb.RoundSpec:
        now = int(time.time() * 1000)
        fields = dict(round_id=round_id, coordinator_id="coord", target=TARGET,
                      feature_names=FEATURES, epsilon=EPSILON, x_bound=0.5, y_bound=2.0,
                      budget_split=[0.30, 0.50, 0.05, 0.15],
                      preprocessing=pb.Preprocessing(x_mean=[0.0] * 3, y_mean=0.0,
                                                     normalize_rows=True),
                      quorum=quorum, deadline_unix_ms=now + int(deadline_s * 1000),
                      created_unix_ms=now, fit_method="laplace", fit_draws=200, fit_seed=1,
                      aggregation="secure", noise_threshold=t, max_site_rows=rows,
                      colluders=colluders, sites=list(sites or self.sites))
        if consent_s is not None:
            fields["consent_deadline_unix_ms"] = now + int(consent_s * 1000)
        fields.update(kw)
        return pb.RoundSpec(**fields)


class SiteDriver:
    """One site answered by hand: a Subscribe stream read by a thread into a queue, the
    SiteNode's answer to each pushed message sent by the test when it says so."""

    def __init__(self, fed: SecureFed, site: str, address: str | None = None):
        self.fed, self.site = fed, site
        self.node = fed.node(site)
        self.address = address or fed.address
        self.inbox: queue.Queue = queue.Queue()
        self._open()

    def _open(self):
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.AggregatorStub(self.channel)
        self.call = self.stub.Subscribe(self.node.hello())
        self.thread = threading.Thread(target=self._read, args=(self.call,), daemon=True)
        self.thread.start()

    def _read(self, call):
        try:
            for envelope in call:
                self.inbox.put(envelope)
        except grpc.RpcError:
            pass

    def reconnect(self, address: str | None = None):
        """A new stream (after the aggregator restarted); what was queued is dropped."""
        self.close()
        self.address = address or self.address
        self.inbox = queue.Queue()
        deadline = time.monotonic() + 20
        while True:
            try:
                self._open()
                grpc.channel_ready_future(self.channel).result(timeout=5)
                return
            except Exception:   # noqa: BLE001 - the aggregator may still be starting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self):
        self.call.cancel()
        self.channel.close()

    def next(self, timeout: float = 10.0) -> pb.SignedEnvelope:
        return self.inbox.get(timeout=timeout)

    def answer(self, pushed: pb.SignedEnvelope):
        """The node's answer to ``pushed`` (consent for a spec, the step's answer for a
        notice), not yet sent."""
        if pushed.payload_type == "dpfed.v1.RoundSpec":
            return self.node.consent(pushed)
        return self.node.handle_notice(pushed)

    def send(self, answer):
        if answer is None:
            return None
        if answer.payload_type == "dpfed.v1.PhaseMessage":
            return self.stub.SendPhase(answer, timeout=10)
        if answer.payload_type == "dpfed.v1.Contribution":
            reply = self.stub.Contribute(answer, timeout=10)
            if reply.accepted or reply.duplicate:
                rid = parse_canonical(answer.payload, answer.payload_type).round_id
                self.node.ledger.mark_acknowledged(rid)
            return reply
        return self.stub.Refuse(answer, timeout=10)

    def step(self, timeout: float = 10.0):
        """Take the next pushed message, answer it, send the answer; returns (pushed phase,
        answer, reply)."""
        pushed = self.next(timeout)
        answer = self.answer(pushed)
        return notice_phase(pushed), answer, self.send(answer)


def notice_phase(envelope: pb.SignedEnvelope) -> str:
    if envelope.payload_type == "dpfed.v1.RoundSpec":
        return "consent"
    return parse_canonical(envelope.payload, "dpfed.v1.PhaseNotice").phase


def wait_state(manager_or_coordinator, round_id, states, timeout=20.0):
    end = time.monotonic() + timeout
    while True:
        status = manager_or_coordinator.status(round_id)
        if status.state in states or time.monotonic() > end:
            return status
        time.sleep(0.02)
