"""Starting a round from the console: a round.toml (uploaded or pasted) -> a preview (the
forecast and the epsilon every invited site will spend) -> the coordinator confirms -> the
spec is signed with the coordinator's key and sent (coordinator.client.Coordinator).

The spec is built by ``coordinator.roundspec.build_round_spec``, exactly as `dpfed round
start` builds it. A preview is kept in memory for PREVIEW_TTL_S and can be confirmed once;
on confirmation its deadlines are moved by the time the coordinator took to decide, so the
round gets the durations round.toml asked for.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from dpfed.v1 import dpfed_pb2 as pb
from dpfed_apps.console import views
from dpfed_apps.console.data import ConsoleData, ConsoleError, rpc_error

log = logging.getLogger(__name__)

MAX_SPEC_BYTES = 256 * 1024
PREVIEW_TTL_S = 15 * 60
MAX_PREVIEWS = 64
DEFAULT_SITE_ROWS = 500
MAX_SITE_ROWS = 10**9


def spec_problem(message: str) -> ConsoleError:
    return ConsoleError(400, "The round spec cannot be used", message)


def _safe_spec_message(text: str) -> str:
    """A RoundSpecError's sentence without the data value it may quote (a public file's
    non-numeric cell)."""
    return re.sub(r"non-numeric value: .*", "a non-numeric value", text)


def parse_spec(text: str, base_dir: Path):
    """(config dict, unsigned RoundSpec) of a round.toml's text; ConsoleError (400) naming
    what is wrong, without quoting data values."""
    from coordinator.roundspec import RoundSpecError, build_round_spec

    if not text.strip():
        raise spec_problem("The spec is empty: upload a round.toml or paste its text.")
    if len(text.encode()) > MAX_SPEC_BYTES:
        raise spec_problem(f"The spec is larger than {MAX_SPEC_BYTES // 1024} KiB; a round.toml "
                           f"is a few lines.")
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise spec_problem(f"The spec is not valid TOML: {exc}.") from None
    try:
        spec = build_round_spec(config, base_dir=base_dir)
    except RoundSpecError as exc:
        raise spec_problem(_safe_spec_message(str(exc))) from None
    except OSError as exc:
        name = Path(getattr(exc, "filename", "") or "?").name
        raise spec_problem(f"The public rows file {name!r} cannot be read "
                           f"({exc.strerror or type(exc).__name__}); relative paths are "
                           f"relative to {base_dir}.") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise spec_problem(f"A value in the spec has the wrong type or is out of range "
                           f"({type(exc).__name__}): epsilon, bounds, quorum, deadline_s and "
                           f"the fit's draws and seed are numbers, features and sites lists "
                           f"of strings.") from None
    return config, spec


@dataclass(frozen=True)
class SpendPreview:
    """What one invited site will spend if it releases in the round."""
    site_id: str
    hidden: str = ""
    connected: bool = False
    epsilon: float = 0.0
    spent: float = 0.0
    declared: float | None = None
    after: float = 0.0
    remaining_after: float | None = None
    exceeds: bool = False


@dataclass
class Preview:
    preview_id: str
    created: float
    spec: pb.RoundSpec
    sites: list[SpendPreview]
    quorum: int
    forecast: dict | None
    forecast_view: views.ForecastView | None
    forecast_note: str
    warnings: list[str]
    n_per_site: int
    used_by: str | None = None      # the round it started, once confirmed
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def total_epsilon(self) -> float:
        return sum(s.epsilon for s in self.sites)


def spend_previews(spec: pb.RoundSpec, sites) -> tuple[list[SpendPreview], list[str]]:
    """Every invited site's spend (the spec's epsilon, once, if it releases) next to what the
    aggregator records it has spent and declared; warnings for sites that are not connected
    or whose declared total the round would exceed (those will refuse)."""
    listed = {s.site_id: s for s in sites}
    invited = list(spec.sites) or sorted(listed)
    unknown = [s for s in invited if s not in listed]
    if unknown:
        raise spec_problem(f"The spec invites site(s) the aggregator does not know: "
                           f"{', '.join(unknown[:20])}{' ...' if len(unknown) > 20 else ''}.")
    rows, warnings = [], []
    for site in invited:
        s = listed[site]
        if s.hidden:
            rows.append(SpendPreview(site, hidden=s.hidden, epsilon=spec.epsilon))
            continue
        declared = s.declared_total_epsilon or None
        after = s.spent_epsilon + spec.epsilon
        remaining = None if declared is None else declared - after
        rows.append(SpendPreview(site, connected=s.connected, epsilon=spec.epsilon,
                                 spent=s.spent_epsilon, declared=declared, after=after,
                                 remaining_after=remaining,
                                 exceeds=remaining is not None and remaining < -1e-9))
    over = [r.site_id for r in rows if r.exceeds]
    if over:
        warnings.append(f"{len(over)} site(s) would exceed the total budget they declared and "
                        f"will refuse: {', '.join(over[:10])}{' ...' if len(over) > 10 else ''}.")
    offline = [r.site_id for r in rows if not r.hidden and not r.connected]
    if offline:
        warnings.append(f"{len(offline)} invited site(s) are not connected now: "
                        f"{', '.join(offline[:10])}{' ...' if len(offline) > 10 else ''}.")
    return rows, warnings


def public_rows(config: dict, base_dir: Path):
    """(x, y) of the spec's public rows, or None when it names none."""
    from coordinator.roundspec import read_public_rows

    public = config.get("public") or {}
    if not public.get("path"):
        return None
    return read_public_rows(base_dir / public["path"], str(config["target"]),
                            [str(f) for f in config["features"]])


class PreviewStore:
    """Previews waiting for confirmation, in memory, for PREVIEW_TTL_S each."""

    def __init__(self, clock=time.monotonic):
        self._lock = threading.Lock()
        self._items: dict[str, Preview] = {}
        self.clock = clock

    def put(self, preview: Preview) -> None:
        with self._lock:
            self._purge()
            while len(self._items) >= MAX_PREVIEWS:
                self._items.pop(next(iter(self._items)))
            self._items[preview.preview_id] = preview

    def get(self, preview_id: str) -> Preview:
        with self._lock:
            self._purge()
            preview = self._items.get(preview_id)
        if preview is None:
            raise ConsoleError(410, "This preview has expired",
                               f"Previews are kept {PREVIEW_TTL_S // 60} minutes and for one "
                               f"start. Upload the spec again to see a fresh preview.")
        return preview

    def _purge(self) -> None:
        now = self.clock()
        for key in [k for k, p in self._items.items() if now - p.created > PREVIEW_TTL_S]:
            del self._items[key]


class RoundStarter:
    """Previews and starts rounds for one console."""

    def __init__(self, data: ConsoleData, spec_dir: Path, *, can_sign: bool,
                 previews: PreviewStore | None = None):
        self.data = data
        self.spec_dir = Path(spec_dir)
        self.can_sign = can_sign
        self.previews = previews or PreviewStore()

    def preview(self, text: str, rows_text: str = "") -> Preview:
        config, spec = parse_spec(text, self.spec_dir)
        if rows_text.strip():
            try:
                n = int(rows_text)
            except ValueError:
                raise spec_problem("Rows per site must be a whole number.") from None
        else:
            n = config.get("expected_site_n", DEFAULT_SITE_ROWS)
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_SITE_ROWS:
            raise spec_problem(f"Rows per site must be a whole number from 2 to {MAX_SITE_ROWS}.")
        sites, warnings = spend_previews(spec, self.data.site_infos())
        quorum = spec.quorum or len(sites)
        if quorum > len(sites):
            raise spec_problem(f"The quorum ({quorum}) is larger than the {len(sites)} invited "
                               f"site(s).")
        forecast, note = None, ""
        try:
            from dpfed_apps.console.forecasts import forecast_for_spec, joint_public_rows
            if len(spec.targets):      # a joint round: its first target, every target released
                rows = joint_public_rows(spec, config, self.spec_dir)
            else:
                rows = public_rows(config, self.spec_dir)
            if rows is None:
                note = ("No forecast: the spec names no public rows (public.path), and the "
                        "forecast simulates the round on data shaped like them.")
            else:
                forecast = forecast_for_spec(spec, rows[0], rows[1], [n] * len(sites),
                                             **({"response_rate": rows[2]} if len(rows) > 2
                                                else {}))
        except (ValueError, OSError) as exc:
            log.warning("forecast for a preview failed: %s", exc)
            note = f"No forecast: it could not be computed ({type(exc).__name__})."
        preview = Preview(preview_id=secrets.token_urlsafe(18), created=self.previews.clock(),
                          spec=spec, sites=sites, quorum=quorum, forecast=forecast,
                          forecast_view=views.forecast_view(
                              {"forecast": forecast, "made_unix_ms": int(time.time() * 1000)}
                              if forecast else None),
                          forecast_note=note, warnings=warnings, n_per_site=n)
        self.previews.put(preview)
        return preview

    def start(self, preview_id: str) -> str:
        """Sign and start the previewed round; returns its id. A preview starts one round:
        a second confirmation (a double click) answers with the same round."""
        if not self.can_sign:
            raise ConsoleError(403, "This console cannot start rounds",
                               "coordinator.toml has no signing_key (and coordinator_id), so "
                               "this console is read-only.")
        preview = self.previews.get(preview_id)
        with preview.lock:
            if preview.used_by:
                return preview.used_by
            spec = pb.RoundSpec()
            spec.CopyFrom(preview.spec)
            shift = int(time.time() * 1000) - spec.created_unix_ms
            spec.created_unix_ms += shift
            spec.deadline_unix_ms += shift
            if spec.consent_deadline_unix_ms:
                spec.consent_deadline_unix_ms += shift
            from coordinator.client import KeyPinError
            try:
                status = self.data.coordinator.start_round(spec)
            except grpc.RpcError as exc:
                raise rpc_error(exc, self.data.address, what="round") from None
            except KeyPinError as exc:   # a secure round whose key pins fail: nothing signed
                raise ConsoleError(400, "The coordinator refused to sign the round",
                                   str(exc)) from None
            preview.used_by = status.round_id
        log.info("round %s started from the console: eps %g, %d invited site(s), quorum %d",
                 status.round_id, spec.epsilon, len(preview.sites), preview.quorum)
        if preview.forecast is not None:
            try:
                self.data.forecasts.save(status.round_id, preview.forecast,
                                         note=f"{preview.n_per_site} rows per site (planned)")
            except OSError as exc:
                log.warning("round %s: the forecast could not be kept: %s", status.round_id, exc)
        return status.round_id
