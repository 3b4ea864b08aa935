"""Console page-render benchmark (issue 13): each page of ``dpfed console`` timed against a
real aggregator whose store holds 1000 sites and 500 rounds.

The store is filled through the aggregator's own store API (aggregator.store.RoundStore), with
what a real federation leaves there: coordinator-signed specs (Ed25519), site-signed consents
and contributions carrying release-sized statistics, refusals with reasons, each site's
signed declaration of its total budget, and for every finished round a result summary made by
``aggregator.aggregate.summarize`` (with its quality statement) and its posterior draws. Every
20th round invites all 1000 sites, the others 50 sites drawn at random; 4 % of the invited
refuse, 2 % drop out; one round in 25 fails. Then a real aggregator (aggregator.server,
in this process, plaintext on loopback) recovers from that store, the console serves in a
thread over gRPC, and each page is fetched over HTTP ``--repeat`` times (server side: request
to last byte) and, with ``--browser``, loaded in headless Chromium (navigation start to the
load event). The rounds list is paged (50 a page; ListRounds ``before``).
"""

from __future__ import annotations

import json
import secrets
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

N_SITES, N_ROUNDS, DIM = 1000, 500, 10
FEATURES = [f"gene_{i}_mut" for i in range(DIM)]


def fill_store(folder: Path, *, sites: int = N_SITES, rounds: int = N_ROUNDS, seed: int = 0,
               draws: int = 400) -> dict:
    """Keys, aggregator.toml content and a filled store in ``folder``; returns facts about it."""
    from aggregator import aggregate
    from aggregator.store import RoundStore, StoredResult
    from dpfed.statistics import Statistics
    from dpfed.v1 import dpfed_pb2 as pb
    from dpfed.wire.canonical import digest
    from dpfed.wire.signing import SigningKey, public_key_pem

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    coordinator = SigningKey.generate()
    coordinator.save(folder / "coordinator.key", folder / "coordinator.pub")
    names = [f"site-{i:04d}" for i in range(sites)]
    keys = {name: SigningKey.generate() for name in names}
    for name, key in keys.items():
        (folder / f"{name}.pub").write_bytes(public_key_pem(key.public_key))
    store = RoundStore(folder / "agg.sqlite")
    t0 = int(time.time() * 1000) - rounds * 3_600_000
    statements = []
    for name in names:
        hello = keys[name].sign(pb.SiteHello(site_id=name, timestamp_unix_ms=t0,
                                             nonce=secrets.token_hex(16), total_epsilon=100.0,
                                             trusted_coordinator_key_ids=[coordinator.key_id]))
        statements.append(("INSERT INTO site_declarations (site_id, total_epsilon, "
                           "trusted_key_ids, hello, received_ms) VALUES (?,?,?,?,?)",
                           (name, 100.0, json.dumps([coordinator.key_id]),
                            hello.SerializeToString(), t0)))
    store._tx(statements)
    contributions = refusals = 0
    for r in range(rounds):
        started = t0 + r * 3_600_000
        invited = names if r % 20 == 0 else sorted(rng.choice(names, 50, replace=False).tolist())
        round_id = f"r-bench-{r:04d}"
        spec = pb.RoundSpec(round_id=round_id, coordinator_id="coord", target="drug_ic50",
                            feature_names=FEATURES, epsilon=1.0, x_bound=0.3, y_bound=1.5,
                            budget_split=[0.35, 0.6, 0.03, 0.02], quorum=len(invited) // 2,
                            deadline_unix_ms=started + 600_000, sites=invited,
                            created_unix_ms=started, fit_method="laplace", fit_draws=draws)
        envelope = coordinator.sign(spec)
        failed = r % 25 == 7
        roll = rng.random(len(invited))
        refused = [s for s, u in zip(invited, roll) if u < 0.04]
        dropped = [s for s, u in zip(invited, roll) if 0.04 <= u < 0.06]
        released = [] if failed else [s for s, u in zip(invited, roll) if u >= 0.06]
        participants = [s for s in invited if s not in refused]
        phases = [["CONSENT", started, 4.2], ["RELEASE", started + 4200, 12.5],
                  ["FITTING", started + 16700, 0.08]]
        statements = [(
            "INSERT INTO rounds (round_id, spec_envelope, spec_digest, dim, quorum, deadline_ms, "
            "invited, state, message, started_ms, round_s, fit_s, participants, phases, "
            "secure_step, phase_deadline_ms) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (round_id, envelope.SerializeToString(), digest(envelope.payload), DIM, spec.quorum,
             spec.deadline_unix_ms, json.dumps(invited), "FAILED" if failed else "DONE",
             "fewer than the quorum released" if failed else "", started, 16.7, 0.08,
             json.dumps(participants), json.dumps(phases[:2] if failed else phases), "", 0))]
        for s in participants:
            consent = keys[s].sign(pb.PhaseMessage(round_id=round_id, site_id=s, phase="consent",
                                                   spec_digest=digest(envelope.payload),
                                                   timestamp_unix_ms=started + 1000,
                                                   nonce=secrets.token_hex(16)))
            statements.append(("INSERT INTO consents VALUES (?,?,?,?)",
                               (round_id, s, consent.SerializeToString(), started + 1000)))
        for s in refused:
            refusal = keys[s].sign(pb.Refusal(round_id=round_id, site_id=s,
                                              spec_digest=digest(envelope.payload),
                                              reason="policy: epsilon per round above 0.5",
                                              timestamp_unix_ms=started + 900,
                                              nonce=secrets.token_hex(16)))
            statements.append(("INSERT INTO refusals (round_id, site_id, reason, envelope, "
                               "received_ms, epsilon) VALUES (?,?,?,?,?,?)",
                               (round_id, s, "policy: epsilon per round above 0.5",
                                refusal.SerializeToString(),
                                started + 900, 0.0)))
        refusals += len(refused)
        rows = []
        for s in released:
            a = rng.normal(size=(DIM, DIM))
            stats = Statistics(a + a.T, rng.normal(size=DIM), float(rng.uniform(50, 90)),
                               int(rng.integers(100, 400)))
            c = pb.Contribution(round_id=round_id, site_id=s, statistics=stats.to_bytes(),
                                n=stats.n, epsilon_spent=1.0,
                                spec_digest=digest(envelope.payload),
                                timestamp_unix_ms=started + 5000, nonce=secrets.token_hex(16))
            env = keys[s].sign(c)
            statements.append(("INSERT INTO contributions VALUES (?,?,?,?,?,?,?)",
                               (round_id, s, env.SerializeToString(), c.statistics, c.n, 1.0,
                                started + 5000 + len(rows))))
            rows.append((s, c.n, 1.0))
        contributions += len(rows)
        store._tx(statements)
        if not failed:
            beta_draws = rng.normal(0.1, 0.3, size=(draws, DIM))
            public = rng.normal(0.1, 0.5, size=(draws, DIM))
            from posterior.quality import information_statement
            from dpfed.intervals import credible_interval
            info = information_statement(beta_draws, public, reference="the 10 public rows alone")
            info["reference_beta_ci90"] = credible_interval(public, 0.9).tolist()
            summary = aggregate.summarize(
                spec=spec, contributions=rows, total=Statistics.zeros(DIM), public=None,
                beta_mean=beta_draws.mean(axis=0), beta_draws=beta_draws,
                diagnostics={"model": "noise-aware", "information": info}, round_s=16.7,
                fit_s=0.08)
            from dpfed import jsonsafe
            store.finish_round(StoredResult(round_id, jsonsafe.dumps(summary, sort_keys=True),
                                            beta_draws.astype("<f8").tobytes(), draws, DIM),
                               0.08, phases=phases)
    store.close()
    raw = {"listen": "127.0.0.1:0", "state_db": "agg.sqlite", "insecure": True,
           "max_clock_skew_s": 300, "sites": [{"site_id": n, "public_key": f"{n}.pub"}
                                             for n in names],
           "coordinators": [{"coordinator_id": "coord", "public_key": "coordinator.pub"}]}
    return {"raw": raw, "sites": sites, "rounds": rounds, "contributions": contributions,
            "refusals": refusals, "db_mb": (folder / "agg.sqlite").stat().st_size / 1e6}


def _fetch(url: str, token: str) -> tuple[float, int, int]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    t = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
        status = response.status
    return (time.perf_counter() - t) * 1000, status, len(body)


def pages(first_site: str, big_round: str, small_round: str, page2: str) -> dict[str, str]:
    return {
        "sites (1000 rows)": "/sites",
        "site (its rounds)": f"/sites/{first_site}",
        "rounds (first 50)": "/rounds",
        "rounds (a later page)": f"/rounds?before={page2}",
        "round, 1000 sites + result": f"/rounds/{big_round}",
        "round, 50 sites + result": f"/rounds/{small_round}",
        "round live part (fragment)": f"/rounds/{big_round}?fragment=1",
        "start a round (form)": "/rounds/new",
    }


def run(*, repeat: int = 20, browser: bool = False, folder: Path | None = None) -> dict:
    from aggregator.config import config_from_dict
    from aggregator.server import AggregatorServer
    from coordinator.client import Coordinator
    from dpfed_apps.console.config import ConsoleSettings
    from dpfed_apps.console.server import serve_in_thread

    folder = Path(folder or tempfile.mkdtemp(prefix="bench-console-"))
    t = time.perf_counter()
    facts = fill_store(folder)
    facts["fill_s"] = time.perf_counter() - t
    t = time.perf_counter()
    server = AggregatorServer(config_from_dict(facts["raw"], folder))
    address = f"127.0.0.1:{server.start()}"
    facts["aggregator_start_s"] = time.perf_counter() - t
    coordinator = Coordinator(address, folder / "coordinator.key", "coord", timeout_s=30)
    console = serve_in_thread(coordinator, address, ConsoleSettings(port=0, state_dir=folder / "cs",
                                                                    spec_dir=folder),
                              coordinator_id="coord")
    base = console.url.rstrip("/")
    results = {}
    try:
        listed = coordinator.list_rounds(limit=50).rounds
        targets = pages("site-0000", "r-bench-0480", "r-bench-0481", listed[-1].round_id)
        for name, path in targets.items():
            _fetch(base + path, console.token)          # warm: first use of the template
            times, size, status = [], 0, 0
            for _ in range(repeat):
                ms, status, size = _fetch(base + path, console.token)
                times.append(ms)
            results[name] = {"path": path, "status": status, "kib": size / 1024,
                             "median_ms": statistics.median(times),
                             "p95_ms": float(np.percentile(times, 95)), "max_ms": max(times)}
        if browser:
            _browser_times(base, targets, results, repeat=max(3, repeat // 4),
                           login_url=console.login_url)
    finally:
        console.stop()
        coordinator.close()
        server.stop(0.5)
    return {"facts": {k: v for k, v in facts.items() if k != "raw"}, "pages": results,
            "repeat": repeat}


def _browser_times(base: str, targets: dict, results: dict, *, repeat: int,
                   login_url: str) -> None:
    """Navigation start to the load event in headless Debian Chromium, median of ``repeat``."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="bench-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path="/usr/bin/chromium", headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"])
        page = context.new_page()
        page.goto(login_url)                      # the console's token: sets its cookie
        for name, path in targets.items():
            if "fragment" in path:
                continue
            times = []
            for _ in range(repeat + 1):
                page.goto(base + path, wait_until="load")
                times.append(page.evaluate(
                    "() => { const n = performance.getEntriesByType('navigation')[0];"
                    " return n.loadEventEnd - n.startTime; }"))
            results[name]["browser_load_ms"] = statistics.median(times[1:])
        context.close()


def markdown(report: dict) -> str:
    f = report["facts"]
    lines = [f"Store: {f['sites']} sites, {f['rounds']} rounds, {f['contributions']} contributions, "
             f"{f['refusals']} refusals, {f['db_mb']:.0f} MB (filled in {f['fill_s']:.0f} s; the "
             f"aggregator recovers it in {f['aggregator_start_s']:.1f} s).", "",
             "| page | path | size KiB | server median ms | p95 ms | max ms | browser load ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in report["pages"].items():
        browser = r.get("browser_load_ms")
        lines.append(f"| {name} | `{r['path']}` | {r['kib']:.0f} | {r['median_ms']:.0f} | "
                     f"{r['p95_ms']:.0f} | {r['max_ms']:.0f} | "
                     f"{'' if browser is None else f'{browser:.0f}'} |")
    return "\n".join(lines)
