"""The data-access layer: the aggregator's read-only RPCs, as the coordinator, turned into the
view models of dpfed_apps.console.views; every failure turned into a ``ConsoleError`` with
an HTTP status and a sentence a person can act on (the page shows it; never a traceback).
"""

from __future__ import annotations

import json
import logging
import time

import grpc

from dpfed.wire.limits import ID_PATTERN, MAX_ID_CHARS
from dpfed_apps.console import views
from dpfed_apps.console.forecasts import ForecastStore

log = logging.getLogger(__name__)

ROUNDS_PER_PAGE = 50


class ConsoleError(Exception):
    """What went wrong, for the page: HTTP ``status``, a ``title`` and a ``message``."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def valid_id(value: str) -> bool:
    return 0 < len(value) <= MAX_ID_CHARS and bool(ID_PATTERN.fullmatch(value))


def check_id(value: str, what: str) -> str:
    if not valid_id(value):
        raise ConsoleError(400, f"Not a valid {what} id",
                           f"A {what} id has 1 to {MAX_ID_CHARS} letters, digits and . _ : @ - "
                           f"and starts with a letter or digit.")
    return value


def rpc_error(exc: grpc.RpcError, address: str, *, what: str = "") -> ConsoleError:
    """The ConsoleError of a failed RPC. The aggregator's own sentence is shown where it is
    one (refusals name what was wrong); transport details only in the log."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    log.warning("aggregator %s: %s%s: %s", address, what and what + ": ", code.name, details)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ConsoleError(503, "The aggregator cannot be reached",
                            f"The aggregator at {address} did not answer ({code.name}). It may "
                            f"be down or restarting, or the network between this console and it "
                            f"is interrupted. This page works again once it answers.")
    if code == grpc.StatusCode.NOT_FOUND:
        return ConsoleError(404, f"No such {what or 'item'}",
                            f"The aggregator knows no {what or 'item'} of that id.")
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return ConsoleError(403, "The aggregator refused this coordinator",
                            f"The aggregator refused ({code.name}): {details}")
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                grpc.StatusCode.FAILED_PRECONDITION):
        return ConsoleError(400, "The aggregator refused the request",
                            f"The aggregator refused ({code.name}): {details}")
    return ConsoleError(502, "The aggregator failed",
                        f"The aggregator answered {code.name}; its log says more.")


class ConsoleData:
    """The console's reads, over ``coordinator`` (a coordinator.client.Coordinator or
    anything with its methods)."""

    def __init__(self, coordinator, address: str, forecasts: ForecastStore, *,
                 clock=time.time):
        self.coordinator = coordinator
        self.address = address
        self.forecasts = forecasts
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except grpc.RpcError as exc:
            raise rpc_error(exc, self.address, what=what) from None

    def site_infos(self):
        return self._call("site", self.coordinator.list_sites)

    def sites(self) -> views.SitesPage:
        return views.sites_page(self.site_infos(), self.now_ms())

    def site(self, site_id: str) -> views.SitePage:
        check_id(site_id, "site")
        info = next((s for s in self.site_infos() if s.site_id == site_id), None)
        if info is None:
            raise ConsoleError(404, "No such site", "The aggregator has no site of that id "
                                                    "registered.")
        spending = None if info.hidden else self._call("site", self.coordinator.site_spending,
                                                       site_id)
        return views.site_page(info, spending, self.now_ms())

    def rounds(self, before: str | None = None, limit: int = ROUNDS_PER_PAGE) -> views.RoundsPage:
        if before:
            check_id(before, "round")
        reply = self._call("round", lambda: self.coordinator.list_rounds(limit=limit,
                                                                         before=before or ""))
        return views.rounds_page(reply, limit, before)

    def status(self, round_id: str):
        check_id(round_id, "round")
        return self._call("round", self.coordinator.status, round_id)

    def round(self, round_id: str, target: str | None = None):
        """(RoundDetail, ResultView or None, ForecastView or None, why there is no result).
        A joint round's result shows ``target``'s coefficients (default: its first fitted
        target) beside the table of every target."""
        status = self.status(round_id)
        detail = views.round_detail(status)
        result, no_result = None, ""
        if detail.state == "DONE":
            summary = self.summary(round_id)
            result = (views.joint_result_view(summary, target) if summary.get("joint")
                      else views.result_view(summary))
        elif detail.state == "FAILED":
            no_result = "The round failed, so it has no result."
        else:
            no_result = "The result appears here when the round is DONE."
        forecast = views.forecast_view(self.forecasts.load(round_id))
        return detail, result, forecast, no_result

    def summary(self, round_id: str) -> dict:
        check_id(round_id, "round")
        result = self._call("round", self.coordinator.result, round_id)
        try:
            return json.loads(result.summary_json)
        except ValueError:
            log.error("round %s: the aggregator's summary is not JSON", round_id)
            raise ConsoleError(502, "The result cannot be read",
                               "The aggregator's summary of this round is not valid JSON.") from None

    def result_json(self, round_id: str) -> bytes:
        """The result summary as the aggregator sent it, with the posterior draws' shape."""
        check_id(round_id, "round")
        result = self._call("round", self.coordinator.result, round_id)
        return result.summary_json.encode()
