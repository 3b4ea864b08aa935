"""The console's parts without a browser (issue 13): the view models and the SVG plot as pure
functions, the settings' bind rules, and the routes over a fake coordinator with Starlette's
TestClient: error pages (status, message, no traceback), the access token (always required,
on loopback too: ?token= login with its cookie and redirect, Bearer, wrong tokens), CSRF, the
host check and the start-round flow's checks."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET

import grpc
import pytest

from dpfed.v1 import dpfed_pb2 as pb

pytest.importorskip("starlette")
pytest.importorskip("httpx2")

from dpfed_apps.console import views  # noqa: E402
from dpfed_apps.console.config import (ConsoleConfigError, ConsoleSettings,  # noqa: E402
                                       check_settings, is_loopback, read_token, settings_from)
from dpfed_apps.console.plot import interval_plot, nice_ticks  # noqa: E402

NOW = 1_800_000_000_000
SVG = "{http://www.w3.org/2000/svg}"


# ---- view models ---------------------------------------------------------------------------
def test_site_rows_show_spend_declared_total_and_what_is_left():
    rows = views.sites_page([
        pb.SiteInfo(site_id="a", connected=True, last_seen_unix_ms=NOW - 30_000,
                    spent_epsilon=3.0, declared_total_epsilon=4.0, rounds=2),
        pb.SiteInfo(site_id="b", spent_epsilon=5.0, declared_total_epsilon=5.0, rounds=3),
        pb.SiteInfo(site_id="c", last_seen_unix_ms=0),
        pb.SiteInfo(site_id="d", hidden="hidden: site 'd' does not trust coordinator 'x'"),
    ], NOW)
    a, b, c, d = rows.rows
    assert (a.connected, a.last_seen_ago, a.rounds, a.remaining, a.used_percent) == \
        (True, "30 s ago", 2, 1.0, 75)
    assert b.exhausted and b.remaining == 0 and b.used_percent == 100
    assert c.declared is None and c.remaining is None and c.last_seen_ago == "never"
    assert d.hidden and d.spent == 0 and d.declared is None   # no zeros shown as facts
    assert (rows.total, rows.connected, rows.exhausted, rows.hidden, rows.spent) == (4, 1, 1, 1, 8.0)


def test_site_page_lists_rounds_newest_first_with_the_running_total():
    info = pb.SiteInfo(site_id="a", spent_epsilon=3.0)
    spending = pb.SiteSpending(site_id="a", spent_epsilon=3.0, rounds=[
        pb.SiteRoundSpend(round_id="r1", epsilon=1.0, received_unix_ms=NOW - 2000),
        pb.SiteRoundSpend(round_id="r2", epsilon=2.0, received_unix_ms=NOW - 1000, refused=True)])
    page = views.site_page(info, spending, NOW)
    assert [(s.round_id, s.epsilon, s.refused, s.cumulative) for s in page.spends] == \
        [("r2", 2.0, True, 3.0), ("r1", 1.0, False, 1.0)]
    assert views.site_page(info, pb.SiteSpending(site_id="a", hidden="no"), NOW).spends == []


def _status(**kw):
    spec = pb.RoundSpec(round_id="r1", coordinator_id="coord", target="y",
                        feature_names=["x0", "x1"], epsilon=1.5)
    fields = dict(round_id="r1", state=pb.RoundStatus.DONE, quorum=2, spec=spec,
                  invited=["a", "b", "c", "d", "e"], consented=["a", "b", "c"],
                  contributions=[pb.SiteContribution(site_id="a", n=100, epsilon_spent=1.5,
                                                     received_unix_ms=NOW),
                                 pb.SiteContribution(site_id="b", hidden="hidden: not trusted")],
                  refusals=[pb.SiteRefusalInfo(site_id="d", reason="policy: target not allowed")],
                  dropped=["c"],
                  phases=[pb.PhaseTime(phase="CONSENT", started_unix_ms=NOW - 5000, seconds=1.2),
                          pb.PhaseTime(phase="RELEASE", started_unix_ms=NOW - 3800, seconds=0.8),
                          pb.PhaseTime(phase="FITTING", started_unix_ms=NOW - 3000, seconds=0.05)])
    fields.update(kw)
    return pb.RoundStatus(**fields)


def test_round_detail_says_who_released_refused_dropped_and_why():
    d = views.round_detail(_status())
    by = {s.site_id: s for s in d.sites}
    assert (by["a"].outcome, by["a"].n, by["a"].epsilon) == ("released", 100, 1.5)
    assert by["b"].outcome == "released" and by["b"].hidden and by["b"].n is None
    assert by["c"].outcome == "dropped" and "deadline" in by["c"].detail
    assert (by["d"].outcome, by["d"].detail) == ("refused", "policy: target not allowed")
    assert by["e"].outcome == "left out" and "consent" in by["e"].detail
    assert d.counts == {"released": 2, "refused": 1, "dropped": 1, "left out": 1, "waiting": 0,
                        "no answer": 0, "invited": 5, "consented": 3}
    failed = views.round_detail(_status(state=pb.RoundStatus.FAILED, contributions=[],
                                        dropped=[], consented=[]))
    assert [s.outcome for s in failed.sites] == ["no answer"] * 3 + ["refused", "no answer"]
    assert [(p.phase, p.duration) for p in d.phases] == [("CONSENT", "1.2 s"),
                                                          ("RELEASE", "800 ms"),
                                                          ("FITTING", "50 ms")]
    assert d.final and d.epsilon_spent == 1.5 and d.target == "y"


def test_a_running_round_lists_the_sites_it_waits_for():
    d = views.round_detail(_status(
        state=pb.RoundStatus.CONSENT, consented=["a"], contributions=[], refusals=[],
        dropped=[], missing_sites=["b", "c", "d", "e"],
        phases=[pb.PhaseTime(phase="CONSENT", started_unix_ms=NOW)]))
    assert not d.final and d.phases[0].running and d.phases[0].duration == "running"
    assert [s.outcome for s in d.sites] == ["consented", "waiting", "waiting", "waiting", "waiting"]


def _summary(**kw):
    s = {"round_id": "r1", "target": "y", "feature_names": ["x0", "x1", "x2"],
         "beta_mean": [0.5, -0.2, None], "beta_sd": [0.1, 0.3, None],
         "beta_ci90": [[0.3, 0.7], [-0.7, 0.3], [None, None]], "n_total": 300, "n_public": 10,
         "model": "noise-aware", "noise": "laplace", "fit_method": "auto",
         "information": {"verdict": "little", "snr": 0.8, "snr_reference": 0.9,
                         "agreement": 0.5, "reference": "the 10 public rows alone",
                         "text": "The private statistics carried little information: ...",
                         "reference_beta_ci90": [[0.0, 1.0], [-1.0, 0.5], [-0.1, 0.1]]}}
    s.update(kw)
    return s


def test_result_view_warns_when_little_information_and_plots_every_coefficient():
    r = views.result_view(_summary())
    assert r.warning and r.verdict == "little" and "little information" in r.statement
    assert [c.excludes_zero for c in r.rows] == [True, False, False]
    assert r.rows[2].mean is None and r.has_reference_plot
    ok = views.result_view(_summary(information={"verdict": "substantial", "text": "Good."}))
    assert not ok.warning and not ok.has_reference_plot


def test_forecast_view_reads_the_kept_forecast():
    assert views.forecast_view(None) is None
    record = {"made_unix_ms": NOW, "note": "500 rows per site (planned)", "forecast": {
        "sites": 3, "n_per_site": [500] * 3, "per_epsilon": [{
            "epsilon": 1.0, "gain": {"mean": 0.1, "q10": -0.05, "q90": 0.3, "p_positive": 0.8},
            "spearman_public_only": {"mean": 0.2}, "spearman_private_public": {"mean": 0.3},
            "spearman_nonprivate": {"mean": 0.5}}]}}
    f = views.forecast_view(record)
    assert (f.gain_mean, f.gain_q10, f.p_positive, f.sites, f.public_only) == \
        (0.1, -0.05, 0.8, 3, 0.2)


# ---- the plot --------------------------------------------------------------------------------
def _svg(*args, **kw):
    return ET.fromstring(interval_plot(*args, **kw))


def test_plot_has_one_interval_and_one_dot_per_coefficient_on_one_axis():
    root = _svg(["a", "b", "c"], [0.5, -0.2, 1.0], [(0.3, 0.7), (-0.7, 0.3), (0.8, 1.2)])
    coefs = root.findall(f"{SVG}g[@class='coef']")
    assert [g.get("data-feature") for g in coefs] == ["a", "b", "c"]
    bars = [g.find(f"{SVG}line[@class='ci']") for g in coefs]
    dots = [g.find(f"{SVG}circle[@class='mean']") for g in coefs]
    assert all(b is not None for b in bars) and all(d is not None for d in dots)
    # One linear axis: the bar ends and the dot keep their order and proportions.
    x = [(float(b.get("x1")), float(d.get("cx")), float(b.get("x2"))) for b, d in zip(bars, dots)]
    assert all(lo < m < hi for lo, m, hi in x)
    scale = (x[0][2] - x[0][0]) / 0.4
    assert (x[1][2] - x[1][0]) / 1.0 == pytest.approx(scale, rel=1e-3)
    zero = float(root.find(f"{SVG}line[@class='zero']").get("x1"))
    assert x[1][0] < zero < x[1][2] and zero < x[0][0]   # b's interval spans 0, a's does not


def test_plot_escapes_names_and_says_no_estimate_for_missing_values():
    text = interval_plot(["<script>x</script>", "ok"], [None, 1.0], [(None, None), (0.5, 1.5)],
                         reference=[(0.1, 0.2), None])
    assert "<script>" not in text and "&lt;script&gt;" in text
    root = ET.fromstring(text)
    first, second = root.findall(f"{SVG}g[@class='coef']")
    assert first.find(f"{SVG}line[@class='ci']") is None
    assert "no estimate" in "".join(first.itertext())
    assert first.find(f"{SVG}line[@class='ref']") is not None       # the reference still shows
    assert second.find(f"{SVG}line[@class='ref']") is None
    with pytest.raises(ValueError):
        interval_plot(["a"], [1.0, 2.0], [(0, 1)])


def test_nice_ticks_are_round_and_cover_the_range():
    assert nice_ticks(-0.93, 1.27) == [-0.5, 0.0, 0.5, 1.0]
    assert nice_ticks(0.0, 0.0) == [0.0]


# ---- settings --------------------------------------------------------------------------------
def test_loopback_is_the_default_and_other_addresses_need_tls_and_a_token(tmp_path):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert settings_from({}, tmp_path).host == "127.0.0.1"
    with pytest.raises(ConsoleConfigError, match="not a loopback address.*HTTPS.*access token"):
        settings_from({}, tmp_path, host="0.0.0.0")
    cert, key, token = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "t"
    cert.write_text("x")
    key.write_text("x")
    token.write_text("s3cret-s3cret-s3cret\n")
    token.chmod(0o600)
    with pytest.raises(ConsoleConfigError, match="access token"):
        settings_from({"tls_cert": "c.pem", "tls_key": "k.pem"}, tmp_path, host="0.0.0.0")
    with pytest.raises(ConsoleConfigError, match="HTTPS"):
        settings_from({"token_file": "t"}, tmp_path, host="0.0.0.0")
    ok = settings_from({"tls_cert": "c.pem", "tls_key": "k.pem", "token_file": "t"}, tmp_path,
                       host="0.0.0.0")
    assert ok.token == "s3cret-s3cret-s3cret" and ok.scheme == "https"
    with pytest.raises(ConsoleConfigError, match="unknown key 'console.tokenfile'"):
        settings_from({"tokenfile": "t"}, tmp_path)
    token.chmod(0o644)
    with pytest.raises(ConsoleConfigError, match="read by others"):
        read_token(token)
    token.write_text("short")
    token.chmod(0o600)
    with pytest.raises(ConsoleConfigError, match="at least 16"):
        read_token(token)
    with pytest.raises(ConsoleConfigError, match="both"):
        check_settings(ConsoleSettings(tls_cert=cert))


# ---- routes over a fake coordinator ------------------------------------------------------
class RpcFailure(grpc.RpcError):
    def __init__(self, code, details=""):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class FakeCoordinator:
    coordinator_id = "coord"

    def __init__(self):
        self.signing_key = object()
        self.down = False
        self.started = []
        self.sites = [pb.SiteInfo(site_id=s, connected=True, spent_epsilon=1.0,
                                  declared_total_epsilon=3.0, rounds=1) for s in ("a", "b", "c")]

    def _check(self):
        if self.down:
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")

    def list_sites(self):
        self._check()
        return self.sites

    def site_spending(self, site_id):
        self._check()
        return pb.SiteSpending(site_id=site_id, rounds=[pb.SiteRoundSpend(round_id="r1",
                                                                          epsilon=1.0)])

    def list_rounds(self, limit=0, before=""):
        self._check()
        return pb.ListRoundsReply(rounds=[pb.RoundSummary(round_id="r1", state=pb.RoundStatus.DONE,
                                                          target="y", epsilon=1.5)])

    def status(self, round_id):
        self._check()
        if round_id != "r1":
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, f"unknown round {round_id!r}")
        return _status()

    def result(self, round_id):
        self._check()
        return pb.RoundResult(round_id="r1", summary_json=json.dumps(_summary()))

    def start_round(self, spec):
        self._check()
        self.started.append(spec)
        return pb.RoundStatus(round_id=spec.round_id)


def _client(tmp_path, *, token=None, coordinator=None, host="127.0.0.1", login=True):
    """A TestClient of a console over ``coordinator`` (a FakeCoordinator by default), logged
    in as a person would be (the printed ?token= address, which sets the session cookie)
    unless ``login=False``. ``client.token``: the console's access token."""
    from starlette.testclient import TestClient

    from dpfed_apps.console.app import create_app
    from dpfed_apps.console.server import build_console

    coordinator = coordinator or FakeCoordinator()
    settings = ConsoleSettings(host=host, port=8765, state_dir=tmp_path / "state",
                               spec_dir=tmp_path, token=token)
    console = build_console(coordinator, "agg.example:50051", settings, coordinator_id="coord")
    app = create_app(console)
    app.port = 8765
    client = TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False)
    client.coordinator = coordinator
    client.console = console
    client.token = console.settings.token
    if login:
        r = client.get(f"/?token={client.token}", follow_redirects=False)
        assert r.status_code == 303 and "dpfed_console_8765" in client.cookies
    return client


def _no_traceback(text):
    assert "Traceback" not in text and 'File "' not in text


def test_pages_render_and_errors_are_pages_with_their_status(tmp_path):
    c = _client(tmp_path)
    for path in ("/rounds", "/rounds/r1", "/sites", "/sites/a", "/rounds/new"):
        r = c.get(path)
        assert r.status_code == 200, path
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"
    r = c.get("/rounds/r1")
    assert "Warning: " in r.text and "little information" in r.text
    assert r.text.count('class="ci"') == 2 + 1          # two finite intervals + the legend
    assert c.get("/rounds/r1/result.json").json()["round_id"] == "r1"
    missing = c.get("/rounds/nope")
    assert missing.status_code == 404 and "No such round" in missing.text
    bad = c.get("/rounds/..%2Fetc")
    assert bad.status_code in (400, 404) and "dpfed console" in bad.text
    assert c.get("/sites/zzz").status_code == 404
    assert c.get("/no/such/page").status_code == 404
    c.coordinator.down = True
    down = c.get("/sites")
    assert down.status_code == 503 and "cannot be reached" in down.text
    assert "agg.example:50051" in down.text
    assert "failed to connect" not in down.text            # transport details stay in the log
    fragment = c.get("/rounds/r1?fragment=1")
    assert fragment.status_code == 503 and "<html" not in fragment.text
    for r in (missing, bad, down, fragment):
        _no_traceback(r.text)


def test_an_unexpected_failure_is_a_page_not_a_traceback(tmp_path):
    coordinator = FakeCoordinator()
    coordinator.list_rounds = lambda **kw: 1 / 0
    r = _client(tmp_path, coordinator=coordinator).get("/rounds")
    assert r.status_code == 500 and "The console failed" in r.text
    _no_traceback(r.text)
    assert "ZeroDivisionError" not in r.text


def test_the_access_token_is_required_when_configured(tmp_path):
    token = "t0ken-t0ken-t0ken-t0ken"
    c = _client(tmp_path, token=token, login=False)
    assert c.token == token and not c.console.settings.token_generated
    # The printed address names no token from token_file (the operator has it; logs stay clean).
    assert c.console.settings.login_url(8765) == "http://127.0.0.1:8765/"
    r = c.get("/rounds")
    assert r.status_code == 401 and 'name="token"' in r.text and "r1" not in r.text
    assert c.get("/rounds/r1/result.json").status_code == 401
    assert c.get("/rounds", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/rounds", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert c.get("/static/console.css").status_code == 200       # the login page's style
    wrong = c.post("/login", data={"token": "nope", "next": "/sites"}, follow_redirects=False)
    assert wrong.status_code == 401 and "not the access token" in wrong.text
    ok = c.post("/login", data={"token": token, "next": "//evil.example/"},
                follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/"     # never off-site
    cookie = ok.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert c.get("/rounds").status_code == 200                         # the cookie now


def _refused(r):
    """A 401 that says how to log in and shows nothing of the federation."""
    assert r.status_code == 401, (r.status_code, r.text[:300])
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "set-cookie" not in r.headers
    for secret in ('data-round="r1"', "<b>coord</b>", "agg.example", "policy: target"):
        assert secret not in r.text
    assert "?token=" in r.text                               # how to log in
    _no_traceback(r.text)


def test_a_loopback_console_without_token_file_makes_a_token_and_requires_it(tmp_path):
    """Issue 19 item 8: on loopback too, without token_file, a request without the token gets
    401 on every page and every POST; no round can be started."""
    c = _client(tmp_path, login=False)
    assert c.console.settings.token_generated and len(c.token) >= 43    # token_urlsafe(32)
    assert c.console.settings.login_url(8765) == f"http://127.0.0.1:8765/?token={c.token}"
    assert c.token not in repr(c.console.settings)
    assert _client(tmp_path, login=False).token != c.token             # fresh at each start
    for path in ("/", "/rounds", "/rounds/r1", "/rounds/r1?fragment=1", "/rounds/r1/result.json",
                 "/sites", "/sites/a", "/rounds/new", "/healthz", "/login", "/no/such/page"):
        r = c.get(path, follow_redirects=False)
        _refused(r)
        assert 'name="token"' in r.text, path              # the login form, not data
    assert c.head("/rounds").status_code == 401
    # The start-round POSTs, even with a matching double-submit CSRF pair and same Origin.
    c.cookies.set("dpfed_csrf", "x" * 32)
    headers = {"origin": "http://127.0.0.1:8765"}
    previewed = c.post("/rounds/new", data={"csrf": "x" * 32, "spec_text": _spec_text(tmp_path)},
                       headers=headers)
    started = c.post("/rounds/start", data={"csrf": "x" * 32, "preview": "p"}, headers=headers,
                     follow_redirects=False)
    for r in (previewed, started):
        _refused(r)
        assert "Authorization: Bearer" in r.text
    assert c.coordinator.started == []


def test_a_wrong_token_is_refused_in_the_query_the_header_and_the_cookie(tmp_path):
    c = _client(tmp_path, login=False)
    wrong = c.token[:-1] + ("A" if c.token[-1] != "A" else "B")
    for r in (c.get(f"/rounds?token={wrong}", follow_redirects=False),
              c.get("/rounds?token=", follow_redirects=False),
              c.get("/rounds", headers={"Authorization": f"Bearer {wrong}"}),
              c.get("/rounds", headers={"Authorization": f"Basic {c.token}"}),
              c.get("/rounds", headers={"cookie": f"dpfed_console_8765={wrong}"}),
              c.get("/rounds", headers={"cookie": f"dpfed_console_9999={c.token}"}),
              c.post("/rounds/start", data={"preview": "p"},
                     headers={"Authorization": f"Bearer {wrong}"})):
        _refused(r)
    restarted = c.get("/rounds", headers={"cookie": f"dpfed_console_8765={wrong}"})
    assert "That is not this console" in restarted.text and "makes a new one" in restarted.text
    # A POST does not log in through the query string.
    _refused(c.post(f"/rounds/start?token={c.token}", data={"preview": "p"}))
    assert c.coordinator.started == []


def test_a_valid_token_in_the_address_sets_the_cookie_and_redirects_without_it(tmp_path):
    c = _client(tmp_path, login=False)
    r = c.get(f"/rounds/r1?fragment=1&token={c.token}", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/rounds/r1?fragment=1"       # the token is gone
    cookie = r.headers["set-cookie"]
    parts = [p.strip().lower() for p in cookie.split(";")]
    assert cookie.startswith(f"dpfed_console_8765={c.token};")
    assert "httponly" in parts and "samesite=strict" in parts and "path=/" in parts
    assert "secure" not in parts                                   # plain HTTP on loopback
    assert not any(p.startswith(("expires", "max-age")) for p in parts)   # a session cookie
    page = c.get(r.headers["location"])                          # the cookie now
    assert page.status_code == 200 and "little information" in page.text
    assert c.get("/rounds").status_code == 200
    assert 'data-round="r1"' in c.get("/rounds").text
    # Another address keeps its other parameters; never a redirect off the console.
    assert c.get(f"/rounds?before=r9&token={c.token}",
                 follow_redirects=False).headers["location"] == "/rounds?before=r9"
    assert c.get(f"/?token={c.token}", follow_redirects=False).headers["location"] == "/"
    assert c.get(f"/login?token={c.token}", follow_redirects=False).headers["location"] == "/"


def test_bearer_authorization_works_for_pages_and_the_start_round_post(tmp_path):
    c = _client(tmp_path, login=False)
    auth = {"Authorization": f"Bearer {c.token}"}
    assert c.get("/rounds").status_code == 401
    assert c.get("/rounds", headers=auth).status_code == 200
    assert c.get("/healthz", headers=auth).text == "ok\n"
    page = c.get("/rounds/new", headers=auth)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    r = c.post("/rounds/new", data={"csrf": csrf, "spec_text": _spec_text(tmp_path),
                                    "site_rows": "200"}, headers=auth)
    assert r.status_code == 200, r.text
    preview = re.search(r'name="preview" value="([^"]+)"', r.text).group(1)
    started = c.post("/rounds/start", data={"csrf": csrf, "preview": preview}, headers=auth,
                     follow_redirects=False)
    assert started.status_code == 303 and len(c.coordinator.started) == 1
    assert "dpfed_console_8765" not in c.cookies                 # Bearer sets no cookie


def test_the_login_form_with_a_generated_token(tmp_path):
    c = _client(tmp_path, login=False)
    wrong = c.post("/login", data={"token": "nope", "next": "/sites"}, follow_redirects=False)
    assert wrong.status_code == 401 and "not the access token" in wrong.text
    assert "agg.example" not in wrong.text and "<b>coord</b>" not in wrong.text
    ok = c.post("/login", data={"token": c.token, "next": "/sites"}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/sites"
    assert "samesite=strict" in ok.headers["set-cookie"].lower()
    assert c.get("/sites").status_code == 200


def test_a_loopback_console_answers_only_to_loopback_names(tmp_path):
    c = _client(tmp_path)
    assert c.get("/rounds", headers={"host": "localhost:8765"}).status_code == 200
    rebound = c.get("/rounds", headers={"host": "attacker.example:8765"})
    assert rebound.status_code == 421 and "r1" not in rebound.text


def _spec_text(tmp_path):
    (tmp_path / "public.csv").write_text(
        "id,x0,x1,y\n" + "\n".join(f"{i},{i % 3 * 0.1:.2f},{i % 2},{i * 0.05:.2f}"
                                   for i in range(12)) + "\n")
    return ('target = "y"\nfeatures = ["x0", "x1"]\nepsilon = 1.0\nx_bound = 0.5\n'
            'y_bound = 1.0\nsites = ["a", "b"]\n[public]\npath = "public.csv"\n')


def _csrf(c):
    page = c.get("/rounds/new")
    return re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


def test_start_round_preview_shows_each_sites_epsilon_and_confirm_starts_once(tmp_path):
    c = _client(tmp_path)
    csrf = _csrf(c)
    r = c.post("/rounds/new", data={"csrf": csrf, "spec_text": _spec_text(tmp_path),
                                    "site_rows": "200"})
    assert r.status_code == 200, r.text
    assert re.findall(r'<tr data-site="(\w)"', r.text) == ["a", "b"]
    assert "expected gain in held-out Spearman" in r.text
    assert c.coordinator.started == []                  # nothing sent before confirming
    preview = re.search(r'name="preview" value="([^"]+)"', r.text).group(1)
    started = c.post("/rounds/start", data={"csrf": csrf, "preview": preview},
                     follow_redirects=False)
    assert started.status_code == 303
    (spec,) = c.coordinator.started
    assert started.headers["location"] == f"/rounds/{spec.round_id}"
    assert list(spec.sites) == ["a", "b"] and spec.epsilon == 1.0
    assert spec.deadline_unix_ms > time.time() * 1000
    again = c.post("/rounds/start", data={"csrf": csrf, "preview": preview},
                   follow_redirects=False)
    assert again.headers["location"] == started.headers["location"]
    assert len(c.coordinator.started) == 1              # a double click starts one round
    # The forecast is kept beside the console for the round's page.
    assert (tmp_path / "state" / "forecasts" / f"{spec.round_id}.json").is_file()


def test_start_round_refuses_forged_and_bad_requests(tmp_path):
    c = _client(tmp_path)
    csrf = _csrf(c)
    text = _spec_text(tmp_path)
    forged = c.post("/rounds/new", data={"csrf": "guess", "spec_text": text})
    assert forged.status_code == 403 and "security token" in forged.text
    other_site = c.post("/rounds/new", data={"csrf": csrf, "spec_text": text},
                        headers={"origin": "http://evil.example"})
    assert other_site.status_code == 403 and "another web page" in other_site.text
    malformed = c.post("/rounds/new", data={"csrf": csrf, "spec_text": "target = [unclosed"})
    assert malformed.status_code == 400 and "not valid TOML" in malformed.text
    unknown_key = c.post("/rounds/new", data={"csrf": csrf, "spec_text": "epsilom = 2\n" + text})
    assert unknown_key.status_code == 400 and "did you mean" in unknown_key.text
    bad_site = c.post("/rounds/new", data={"csrf": csrf,
                                           "spec_text": text.replace('"b"', '"zz"')})
    assert bad_site.status_code == 400 and "does not know: zz" in bad_site.text
    (tmp_path / "public.csv").write_text("id,x0,x1,y\n1,0.1,SECRET-VALUE,2\n")
    bad_data = c.post("/rounds/new", data={"csrf": csrf, "spec_text": text})
    assert bad_data.status_code == 400 and "SECRET-VALUE" not in bad_data.text
    upload = c.post("/rounds/new", data={"csrf": csrf},
                    files={"spec_file": ("round.toml", b"\xff\xfe\x00binary", "text/plain")})
    assert upload.status_code == 400 and "not UTF-8" in upload.text
    expired = c.post("/rounds/start", data={"csrf": csrf, "preview": "nope"})
    assert expired.status_code == 410
    for r in (forged, other_site, malformed, unknown_key, bad_site, bad_data, upload, expired):
        _no_traceback(r.text)
    assert c.coordinator.started == []


def _self_signed(tmp_path):
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def test_https_with_a_token_end_to_end(tmp_path):
    """uvicorn serves HTTPS with the configured certificate, and the token guards it."""
    import ssl
    import urllib.error
    import urllib.request

    from dpfed_apps.console.server import ConsoleServer, build_console

    cert, key = _self_signed(tmp_path)
    token = "https-t0ken-https-t0ken"
    settings = ConsoleSettings(port=0, tls_cert=cert, tls_key=key, token=token,
                               state_dir=tmp_path / "state", spec_dir=tmp_path)
    server = ConsoleServer(build_console(FakeCoordinator(), "agg:1", settings,
                                         coordinator_id="coord")).start()
    try:
        assert server.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(server.url + "rounds", context=context, timeout=10)
        assert denied.value.code == 401
        request = urllib.request.Request(server.url + "rounds",
                                         headers={"Authorization": f"Bearer {token}"})
        page = urllib.request.urlopen(request, context=context, timeout=10).read().decode()
        assert 'data-round="r1"' in page
        import http.client
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
        conn.request("GET", f"/sites?token={token}")
        login = conn.getresponse()
        assert login.status == 303 and login.getheader("location") == "/sites"
        assert "secure" in [p.strip().lower() for p in login.getheader("set-cookie").split(";")]
        conn.close()
        with pytest.raises((urllib.error.URLError, http.client.HTTPException,
                            ConnectionError)):          # no plaintext on the HTTPS port
            urllib.request.urlopen(server.url.replace("https", "http") + "rounds", timeout=5)
    finally:
        server.stop()


def test_start_round_preview_of_a_joint_gaussian_round_forecasts_per_target(tmp_path):
    """A round.toml with targets, mechanism gaussian and delta (issue 23): the preview's
    forecast is for the first target in a release of every target, with (eps, delta) per
    patient, and says the gain is per target."""
    c = _client(tmp_path)
    rows = ["id,x0,x1,t1,t2,t3"] + [
        f"{i},{i % 3 * 0.1:.2f},{i % 2},{i * 0.05:.2f},{'' if i % 4 == 0 else i * 0.1},"
        f"{(i * 7) % 5}" for i in range(12)]
    (tmp_path / "public.csv").write_text("\n".join(rows) + "\n")
    text = ('targets = ["t1", "t2", "t3"]\nfeatures = ["x0", "x1"]\nepsilon = 4.0\n'
            'mechanism = "gaussian"\ndelta = 1e-6\nsites = ["a", "b"]\n'
            '[public]\npath = "public.csv"\n')
    r = c.post("/rounds/new", data={"csrf": _csrf(c), "spec_text": text, "site_rows": "200"})
    assert r.status_code == 200, r.text
    assert "delta 1e-06) per patient" in r.text and "per target" in r.text
    assert "forecast for t1, one of the 3 targets" in r.text
