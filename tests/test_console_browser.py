"""The console in a real browser (issue 13): headless Chromium (Debian's /usr/bin/chromium,
driven by playwright) loads each page of a console talking over mutual TLS to a real
aggregator process with three real site processes (dpfed_apps.simulation's federation), and
checks what a person sees: the site table, the round list with states, a result with its
plot (one interval per coefficient) and its quality statement, a failed round's refusals
and why, the start-round flow (the preview shows each site's epsilon; confirming starts a
round that then appears in the list), a round turning DONE without a reload, and the bad
inputs (a malformed spec upload, an unknown round id, the aggregator down) as clear messages.
Every page needs the console's access token (issue 19 item 8): the browser logs in once by
opening the address the console prints, http://127.0.0.1:PORT/?token=... (which sets the
session cookie and drops the token from the address), or through the login form.

Screenshots of each page go to a temporary folder, or to docs/img/console-*.png with
DPFED_CONSOLE_SCREENSHOTS=docs/img (how the README's pictures are made).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} is absent (apt-get install chromium; "
                                        f".ci/run installs it)")]
playwright_api = pytest.importorskip("playwright.sync_api",
                                     reason="playwright is not installed (pip install -e .[dev])")
pytest.importorskip("starlette")

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
EPSILON = 2.0


def _shots() -> Path:
    target = os.environ.get("DPFED_CONSOLE_SCREENSHOTS")
    path = (ROOT / target) if target and not Path(target).is_absolute() else Path(
        target or tempfile.mkdtemp(prefix="console-shots-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


class World:
    """A federation (aggregator + 3 sites as processes, mutual TLS), two finished rounds, the
    console in this process and a browser."""

    def __init__(self, root: Path):
        from coordinator.client import Coordinator
        from dpfed.tomlwriter import to_toml
        from dpfed.v1 import dpfed_pb2 as pb
        from dpfed.wire.signing import SigningKey
        from dpfed_apps import simulation as sim
        from dpfed_apps.simulation.federation import COORDINATOR_ID, free_port

        self.pb = pb
        problem = sim.gdsc_problem(1047, None)
        split = sim.split_rows(problem.n, n_sites=3, n_public=10, n_test=100, seed=0)
        self.layout = sim.FederationLayout(root)
        port = free_port()
        self.sites = sim.write_federation(self.layout, problem, split, port=port, epsilon=EPSILON)
        self.config = sim.round_config(problem, epsilon=EPSILON, x_bound=0.5, y_bound=2.0,
                                       quorum=3, public_csv=self.layout.public_csv,
                                       fit_method="laplace", fit_draws=400, fit_seed=0,
                                       deadline_s=60)
        self.layout.round_config.write_text(to_toml(self.config))
        self.federation = sim.LocalFederation(self.layout, self.sites, port,
                                              progress=lambda message: None, log_level="WARNING")
        self.federation.start(timeout_s=60)
        self.coordinator = Coordinator(self.federation.address,
                                       SigningKey.load(self.layout.signing_key(COORDINATOR_ID)),
                                       COORDINATOR_ID, self.layout.tls(COORDINATOR_ID),
                                       timeout_s=10)
        self.federation.wait_sites_connected(self.coordinator, 60)
        from coordinator.roundspec import build_round_spec
        self.done_id = self._run({**self.config, "round_id": "r-console-done"})
        # Above every site's max_epsilon_per_round: all refuse in consent, the round fails.
        self.failed_id = self._run({**self.config, "round_id": "r-console-failed",
                                    "epsilon": 3 * EPSILON})
        self.build_round_spec = build_round_spec

    def _run(self, config: dict) -> str:
        from coordinator.roundspec import build_round_spec
        spec = build_round_spec(config, base_dir=self.layout.root)
        status = self.coordinator.start_round(spec)
        status = self.coordinator.wait(status.round_id, 90, poll_s=0.2)
        assert status.state in (self.pb.RoundStatus.DONE, self.pb.RoundStatus.FAILED), status
        return status.round_id

    def start_console(self):
        from dpfed_apps.console.config import ConsoleSettings
        from dpfed_apps.console.forecasts import forecast_for_spec
        from dpfed_apps.console.server import serve_in_thread
        from coordinator.roundspec import read_public_rows
        from dpfed_apps.simulation.federation import COORDINATOR_ID

        settings = ConsoleSettings(port=0, state_dir=self.layout.root / "console",
                                   spec_dir=self.layout.root)
        self.server = serve_in_thread(self.coordinator, self.federation.address, settings,
                                      coordinator_id=COORDINATOR_ID)
        self.url = self.server.url.rstrip("/")
        self.login_url = self.server.login_url            # what `dpfed console` prints
        self.token = self.server.token
        self.cookie = f"dpfed_console_{self.server.port}"
        # The forecast a coordinator would have made before the first round (dpfed plan).
        spec = self.build_round_spec(self.config, base_dir=self.layout.root)
        x, y = read_public_rows(self.layout.public_csv, self.config["target"],
                                self.config["features"])
        self.server.console.data.forecasts.save(
            self.done_id, forecast_for_spec(spec, x, y, [240] * 3), note="test forecast")

    def stop(self):
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()
        self.coordinator.close()
        self.federation.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("console-federation"))
    try:
        w.start_console()
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    with playwright_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS,
            viewport={"width": 1280, "height": 900})
        context.set_default_timeout(20_000)
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shots():
    return _shots()


@pytest.fixture
def page(browser, world):
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    if not any(c["name"] == world.cookie for c in browser.cookies()):
        page.goto(world.login_url)              # log in as a person would: the printed address
    yield page
    page.close()
    assert errors == [], f"JavaScript errors: {errors}"


def _round_report(world, round_id: str, page=None) -> str:
    """What the page shows, what the aggregator says of a round and the federation's log
    tails, for a failure."""
    shown = ""
    if page is not None:
        try:
            shown = "the page shows:\n" + page.locator("body").inner_text()[:3000] + "\n"
        except Exception as exc:  # noqa: BLE001 - a report, not a check
            shown = f"(page unavailable: {exc!r})\n"
    try:
        status = str(world.coordinator.status(round_id))
    except Exception as exc:  # noqa: BLE001 - a report, not a check
        status = f"(status unavailable: {exc!r})"
    return f"{shown}aggregator's status:\n{status}\n{world.federation.log_tails(40)}"


def _cells(row) -> list[str]:
    return [c.strip() for c in row.locator("td").all_inner_texts()]


def test_the_console_needs_its_token_and_the_printed_address_logs_in(world, browser, page):
    """Issue 19 item 8: on loopback too. Without the token a page is 401 and the login form,
    with nothing of the federation; the printed ?token= address sets an HttpOnly,
    SameSite=Strict session cookie and lands on the page without the token in its address;
    the login form works too."""
    browser.clear_cookies()
    response = page.goto(world.url + "/sites")
    assert response.status == 401
    assert page.locator("h1").inner_text() == "Access token"
    assert "?token=" in page.locator("#how-to-log-in").inner_text()
    content = page.content()
    assert not any(site in content for site in world.sites) and "sites-table" not in content
    assert page.locator("nav").count() == 0                        # not even the menu
    assert page.goto(world.url + "/rounds/new").status == 401
    # The printed address: logged in, and the token is not left in the address bar.
    response = page.goto(world.login_url)
    assert response.status == 200 and page.url == world.url + "/rounds"
    assert "token" not in page.url and page.locator("#rounds-table").is_visible()
    (cookie,) = [c for c in browser.cookies() if c["name"] == world.cookie]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert cookie["value"] == world.token and cookie["expires"] == -1     # a session cookie
    # The login form, with the token pasted.
    browser.clear_cookies()
    assert page.goto(world.url + "/sites").status == 401
    page.locator('input[name="token"]').fill("not-the-token-not-the-token")
    with page.expect_navigation():
        page.locator('form.login button[type="submit"]').click()
    assert "not the access token" in page.locator(".error-message").inner_text()
    page.locator('input[name="token"]').fill(world.token)
    with page.expect_navigation():
        page.locator('form.login button[type="submit"]').click()
    assert page.url == world.url + "/sites"
    assert page.locator("#sites-table tbody tr").count() == 3


def test_sites_page_shows_every_site_connected_and_its_spend(world, page, shots):
    page.goto(world.url + "/sites")
    rows = page.locator("#sites-table tbody tr")
    assert rows.count() == 3
    for i, site in enumerate(world.sites):
        cells = _cells(rows.nth(i))
        assert cells[0] == site and cells[1] == "yes"           # connected
        assert "ago" in cells[2]                                # last seen
        assert cells[3] == "1" and float(cells[4]) == EPSILON   # one round, its epsilon
        assert float(cells[5]) == 5 * EPSILON                   # the declared total
        assert float(cells[6]) == 4 * EPSILON                   # what is left
    assert "3 connected" in page.locator("#sites-summary").inner_text()
    page.screenshot(path=str(shots / "console-sites.png"), full_page=True)


def test_site_page_lists_its_spend_round_by_round(world, page):
    page.goto(f"{world.url}/sites/{world.sites[0]}")
    rows = page.locator("#spends-table tbody tr")
    assert rows.count() == 1
    cells = _cells(rows.nth(0))
    assert cells[0] == world.done_id and cells[2] == "release" and float(cells[3]) == EPSILON


def test_rounds_page_lists_the_rounds_with_their_states(world, page, shots):
    page.goto(world.url + "/rounds")
    states = {r.get_attribute("data-round"): r.locator(".state").inner_text()
              for r in page.locator("#rounds-table tbody tr").all()}
    assert states[world.done_id] == "DONE" and states[world.failed_id] == "FAILED"
    page.screenshot(path=str(shots / "console-rounds.png"), full_page=True)


def test_a_done_round_shows_its_result_plot_statement_and_forecast(world, page, shots):
    page.goto(f"{world.url}/rounds/{world.done_id}")
    assert page.locator("#round-state").inner_text() == "DONE"
    phases = [r.get_attribute("data-phase") for r in page.locator("#phases-table tbody tr").all()]
    assert phases == ["CONSENT", "RELEASE", "FITTING"]
    outcomes = page.locator("#round-sites tbody tr")
    assert [r.get_attribute("data-outcome") for r in outcomes.all()] == ["released"] * 3
    # The plot: one interval bar and one dot per coefficient, drawn by the browser.
    features = world.config["features"]
    plot = page.locator("#plot svg.interval-plot")
    assert plot.is_visible()
    assert plot.locator("g.coef").count() == len(features)
    assert plot.locator("g.coef line.ci").count() == len(features)
    assert plot.locator("g.coef circle.mean").count() == len(features)
    assert plot.locator("g.coef line.ref").count() == len(features)    # public-only beside it
    box = plot.bounding_box()
    assert box["width"] > 300 and box["height"] > 20 * len(features)
    labels = plot.locator("g.coef text.name").all_text_contents()
    assert labels == features
    quality = page.locator("#quality").inner_text()
    assert re.search(r"Quality \((little|some|substantial)\)", quality)
    if "(little)" in quality:
        assert quality.startswith("Warning:")
    assert "gain" in page.locator("#forecast-gain").inner_text()
    assert "signal-to-noise" in page.locator("#realised").inner_text()
    assert page.locator("#coefficients tbody tr").count() == len(features)
    href = page.locator("#download-json").get_attribute("href")
    with page.expect_download() as download:
        page.locator("#download-json").click()
    import json
    summary = json.loads(Path(download.value.path()).read_text())
    assert href.endswith("/result.json") and summary["round_id"] == world.done_id
    assert len(summary["beta_ci90"]) == len(features)
    page.screenshot(path=str(shots / "console-round.png"), full_page=True)


def test_a_failed_round_shows_who_refused_and_why(world, page):
    page.goto(f"{world.url}/rounds/{world.failed_id}")
    assert page.locator("#round-state").inner_text() == "FAILED"
    assert "quorum" in page.locator("#round-message").inner_text()
    rows = page.locator("#round-sites tbody tr").all()
    outcomes = [r.get_attribute("data-outcome") for r in rows]
    # The round fails at the first refusal that makes the quorum unreachable; sites that had
    # not answered by then are listed as such.
    assert "refused" in outcomes and set(outcomes) <= {"refused", "no answer"}
    for r, outcome in zip(rows, outcomes):
        why = _cells(r)[2]
        assert ("epsilon" in why) if outcome == "refused" else ("failed before" in why)
    assert "failed" in page.locator("#no-result").inner_text()


def test_start_a_round_preview_confirm_and_watch_it_finish_without_reload(world, page, shots):
    page.goto(world.url + "/rounds/new")
    spec = Path(world.layout.round_config).read_text()
    page.locator("#spec-text").fill(spec)
    page.locator("#site-rows").fill("240")
    with page.expect_navigation():
        page.locator("#preview-button").click()
    assert page.locator("h1").inner_text().startswith("Preview of round"), page.content()
    rows = page.locator("#spend-preview tbody tr")
    assert [r.get_attribute("data-site") for r in rows.all()] == world.sites
    for r in rows.all():
        cells = _cells(r)
        # connected, epsilon this round, spent so far (the done round), after, declared
        assert cells[1] == "yes" and float(cells[2]) == EPSILON
        assert float(cells[3]) == EPSILON and float(cells[4]) == 2 * EPSILON
    assert "expected gain" in page.locator("#preview-forecast").inner_text()
    page.screenshot(path=str(shots / "console-start.png"), full_page=True)
    page.locator("#confirm-button").click()
    page.wait_for_url(re.compile(r".*/rounds/r-[^/]+$"))
    round_id = page.url.rsplit("/", 1)[1]
    assert round_id not in (world.done_id, world.failed_id)
    page.evaluate("window.__no_reload = 1")
    # Wait for the round to end either way (the live part stops refreshing when it is final),
    # so a round that failed or hung says why instead of timing out on a missing "DONE".
    try:
        page.locator('.live-part[data-final="true"]').wait_for(timeout=90_000)
    except playwright_api.TimeoutError:
        pytest.fail(f"round {round_id} did not end within 90 s\n"
                    f"{_round_report(world, round_id, page)}")
    assert page.locator("#round-state").inner_text() == "DONE", _round_report(world, round_id, page)
    assert page.evaluate("window.__no_reload") == 1           # the page itself changed
    assert page.locator("#plot svg g.coef line.ci").count() == len(world.config["features"])
    assert "gain" in page.locator("#forecast-gain").inner_text()   # its forecast was kept
    page.goto(world.url + "/rounds")
    row = page.locator(f'#rounds-table tr[data-round="{round_id}"]')
    assert row.get_attribute("data-state") == "DONE"


def test_the_rounds_list_updates_itself(world, page):
    from coordinator.roundspec import build_round_spec
    page.goto(world.url + "/rounds")
    page.evaluate("window.__no_reload = 1")
    spec = build_round_spec({**world.config, "round_id": "r-console-live",
                             "epsilon": 3 * EPSILON}, base_dir=world.layout.root)
    world.coordinator.start_round(spec)
    page.locator('#rounds-table tr[data-round="r-console-live"][data-state="FAILED"]').wait_for(
        timeout=60_000)
    assert page.evaluate("window.__no_reload") == 1


def test_a_malformed_spec_upload_is_a_clear_message(world, page, tmp_path):
    bad = tmp_path / "round.toml"
    bad.write_text('target = "Drug_1047_IC50"\nepsilon = = 2\n')
    page.goto(world.url + "/rounds/new")
    page.locator("#spec-file").set_input_files(str(bad))
    with page.expect_navigation():
        page.locator("#preview-button").click()
    assert page.locator(".error h2").inner_text() == "The round spec cannot be used"
    message = page.locator(".error-message").inner_text()
    assert "not valid TOML" in message and "line 2" in message
    assert "Traceback" not in page.content()


def test_an_unknown_round_id_is_a_clear_message(world, page, shots):
    response = page.goto(world.url + "/rounds/r-no-such-round")
    assert response.status == 404
    assert page.locator(".error h2").inner_text() == "No such round"
    assert "Traceback" not in page.content()
    page.screenshot(path=str(shots / "console-error.png"), full_page=True)


def test_the_aggregator_down_is_a_clear_message(world, page):
    from coordinator.client import Coordinator
    from dpfed.wire.signing import SigningKey
    from dpfed_apps.console.config import ConsoleSettings
    from dpfed_apps.console.server import serve_in_thread
    from dpfed_apps.simulation.federation import COORDINATOR_ID, free_port

    dead = f"127.0.0.1:{free_port()}"
    coordinator = Coordinator(dead, SigningKey.load(world.layout.signing_key(COORDINATOR_ID)),
                              COORDINATOR_ID, world.layout.tls(COORDINATOR_ID), timeout_s=3)
    server = serve_in_thread(coordinator, dead, ConsoleSettings(
        port=0, state_dir=world.layout.root / "console-dead"), coordinator_id=COORDINATOR_ID)
    try:
        assert page.goto(server.login_url).status == 503          # logged in, then /rounds
        for path in ("/sites", "/rounds", "/rounds/" + world.done_id):
            response = page.goto(server.url.rstrip("/") + path)
            assert response.status == 503, path
            assert page.locator(".error h2").inner_text() == "The aggregator cannot be reached"
            assert dead in page.locator(".error-message").inner_text()
            assert "Traceback" not in page.content()
    finally:
        server.stop()
        coordinator.close()
