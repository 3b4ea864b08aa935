"""The console's web application (Starlette): routes, templates, error pages.

Pages (server-rendered HTML; a small script of our own, served from /static, refreshes the
parts marked live):

  /rounds                     the rounds, newest first, 50 a page (?before=ROUND_ID pages on)
  /rounds/ROUND_ID            a round: state, phases and times, each invited site's part and
                              why; when DONE the posterior plot, the quality statement, the
                              forecast beside the realised result, the JSON download
  /rounds/ROUND_ID/result.json  the result summary, as the aggregator sent it
  /rounds/new                 start a round: upload or paste round.toml -> preview -> confirm
  /sites                      the sites: connection, last seen, epsilon spent, declared total
  /sites/SITE_ID              one site's spending round by round
  /login                      the access-token form

Every page needs the console's access token (security.Guard; docs/console.md): a request
without it gets 401 and a page saying how to log in.

Any page with ``?fragment=1`` answers its live part only (what the script swaps in). Every
failure is a page that says what happened with the matching HTTP status (400 bad input,
404 unknown id, 503 aggregator unreachable, ...), never a traceback; the log has the details.
"""

from __future__ import annotations

import logging
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dpfed_apps.console import security
from dpfed_apps.console.config import ConsoleSettings, is_loopback, with_token
from dpfed_apps.console.data import ConsoleData, ConsoleError
from dpfed_apps.console.startround import MAX_SPEC_BYTES, RoundStarter
from dpfed_apps.console.views import eps

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
# How often the live parts refresh (milliseconds).
LIVE_ROUND_MS, LIVE_ROUNDS_MS, LIVE_SITES_MS = 1000, 3000, 10000


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(["html"], default=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["eps"] = eps
    env.filters["num"] = lambda v, fmt="{:.3g}": "" if v is None else fmt.format(v)
    return env


class Console:
    """One coordinator's console: ``data`` reads, ``starter`` starts rounds."""

    def __init__(self, data: ConsoleData, settings: ConsoleSettings, starter: RoundStarter, *,
                 coordinator_id: str):
        self.data = data
        # The console always has an access token: token_file's, or a fresh one made here.
        self.settings = with_token(settings)
        self.starter = starter
        self.coordinator_id = coordinator_id
        self.env = _environment()

    # ---- rendering ----
    def render(self, request: Request | None, template: str, status: int = 200,
               **context) -> HTMLResponse:
        # A page for a request without the token (the login form's POST) names nothing of
        # the federation, not even the coordinator or the aggregator.
        if context.get("anonymous") is None:
            context["anonymous"] = request is None or not request.scope.get(
                security.AUTHENTICATED)
        html = self.env.get_template(template).render(
            coordinator_id=self.coordinator_id, aggregator=self.data.address,
            can_sign=self.starter.can_sign, **context)
        return HTMLResponse(html, status_code=status)

    def error_page(self, request: Request | None, exc: ConsoleError) -> HTMLResponse:
        fragment = request is not None and request.query_params.get("fragment") == "1"
        return self.render(request, "_error.html" if fragment else "error.html",
                           status=exc.status, error=exc)

    def login_page(self, next_path: str, message: str):
        """The page of a request without the token (security.Guard): how to log in, and
        nothing of the federation (not even the coordinator's or the aggregator's name)."""
        response = self.render(None, "login.html", next=security.safe_next(next_path),
                               message=message, anonymous=True)
        return response.status_code, response.raw_headers, response.body

    def page(self, request: Request, template: str, fragment: str, **context) -> HTMLResponse:
        if request.query_params.get("fragment") == "1":
            return self.render(request, fragment, **context)
        return self.render(request, template, **context)

    # ---- pages ----
    def index(self, request: Request):
        return RedirectResponse("/rounds", status_code=303)

    def sites(self, request: Request):
        page = self.data.sites()
        return self.page(request, "sites.html", "_sites_live.html", sites=page,
                         nav="sites", live_ms=LIVE_SITES_MS)

    def site(self, request: Request):
        page = self.data.site(request.path_params["site_id"])
        return self.render(request, "site.html", page=page, nav="sites")

    def rounds(self, request: Request):
        before = request.query_params.get("before") or None
        page = self.data.rounds(before)
        return self.page(request, "rounds.html", "_rounds_live.html", rounds=page,
                         nav="rounds", live_ms=LIVE_ROUNDS_MS)

    def round(self, request: Request):
        detail, result, forecast, no_result = self.data.round(
            request.path_params["round_id"], request.query_params.get("target") or None)
        return self.page(request, "round.html", "_round_live.html", round=detail,
                         result=result, forecast=forecast, no_result=no_result, nav="rounds",
                         live_ms=LIVE_ROUND_MS)

    def result_json(self, request: Request):
        round_id = request.path_params["round_id"]
        body = self.data.result_json(round_id)
        return Response(body, media_type="application/json", headers={
            "content-disposition": f'attachment; filename="dpfed-result-{round_id}.json"'})

    def new_round(self, request: Request):
        token = request.cookies.get(security.CSRF_COOKIE) or security.new_csrf_token()
        response = self.render(request, "new_round.html", nav="new", csrf=token,
                               max_kib=MAX_SPEC_BYTES // 1024, spec_dir=str(self.starter.spec_dir))
        self._set_csrf(response, token)
        return response

    async def preview(self, request: Request):
        form = await self._form(request)
        upload = form.get("spec_file")
        text = ""
        if upload is not None and hasattr(upload, "read"):
            raw = await upload.read(MAX_SPEC_BYTES + 1)
            if raw:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise ConsoleError(400, "The round spec cannot be used",
                                       "The uploaded file is not UTF-8 text; a round.toml is.")
        if not text:
            text = str(form.get("spec_text") or "")
        preview = await run_in_threadpool(self.starter.preview, text,
                                          str(form.get("site_rows") or ""))
        return self.render(request, "preview.html", nav="new", preview=preview,
                           csrf=request.cookies.get(security.CSRF_COOKIE, ""),
                           spec=preview.spec)

    async def start(self, request: Request):
        form = await self._form(request)
        round_id = await run_in_threadpool(self.starter.start, str(form.get("preview") or ""))
        return RedirectResponse(f"/rounds/{round_id}", status_code=303)

    def login_form(self, request: Request):
        return self.render(request, "login.html", next=security.safe_next(
            request.query_params.get("next", "/")), message="", anonymous=True)

    async def login(self, request: Request):
        body = await request.body()
        if len(body) > 4096:
            raise ConsoleError(413, "Too large", "The login form is a few bytes.")
        token, next_path = security.login_token(body)
        if not security.same_secret(token, self.settings.token):
            log.warning("console login refused from %s", request.client.host if request.client
                        else "?")
            return self.render(request, "login.html", status=401, next=next_path,
                               message="That is not the access token.", anonymous=True)
        response = RedirectResponse(next_path, status_code=303)
        response.headers.append("set-cookie", security.session_cookie(
            request.scope, self.settings.token, secure=self.settings.tls))
        return response

    def healthz(self, request: Request):
        return Response("ok\n", media_type="text/plain")

    # ---- helpers ----
    def _set_csrf(self, response: Response, token: str) -> None:
        response.set_cookie(security.CSRF_COOKIE, token, httponly=True, samesite="strict",
                            secure=self.settings.tls, path="/")

    async def _form(self, request: Request):
        """The POSTed form, after the CSRF checks (security module docstring)."""
        if not security.origin_ok(request.headers, self.settings.scheme):
            raise ConsoleError(403, "Refused: not from this console",
                               "The form was sent from another web page (its Origin is not "
                               "this console's). Use the console's own pages.")
        try:
            form = await request.form(max_files=1, max_fields=8, max_part_size=MAX_SPEC_BYTES)
        except HTTPException as exc:
            raise ConsoleError(400, "The form cannot be read", str(exc.detail)) from None
        except Exception as exc:  # noqa: BLE001 - a malformed multipart body
            log.warning("unreadable form: %s", type(exc).__name__)
            raise ConsoleError(400, "The form cannot be read",
                               "The request body is not a form this page sends.") from None
        if not security.csrf_ok(request.cookies.get(security.CSRF_COOKIE),
                                str(form.get(security.CSRF_FIELD) or "")):
            raise ConsoleError(403, "Refused: the form's security token does not match",
                               "Open the page again from the console (its form carries a token "
                               "that only this console's pages have) and send it from there.")
        return form


def create_app(console: Console) -> security.Guard:
    """The ASGI application: the routes of the module docstring behind security.Guard."""

    def sync(fn):
        async def endpoint(request: Request):
            return await run_in_threadpool(fn, request)
        return endpoint

    routes = [
        Route("/", sync(console.index)),
        Route("/healthz", sync(console.healthz)),
        Route("/sites", sync(console.sites)),
        Route("/sites/{site_id}", sync(console.site)),
        Route("/rounds", sync(console.rounds)),
        Route("/rounds/new", sync(console.new_round)),
        Route("/rounds/new", console.preview, methods=["POST"]),
        Route("/rounds/start", console.start, methods=["POST"]),
        Route("/rounds/{round_id}", sync(console.round)),
        Route("/rounds/{round_id}/result.json", sync(console.result_json)),
        Route("/login", sync(console.login_form)),
        Route("/login", console.login, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]

    async def console_error(request: Request, exc: ConsoleError):
        return console.error_page(request, exc)

    async def http_error(request: Request, exc: HTTPException):
        titles = {404: ("Not found", "This console has no page at that address."),
                  405: ("Not allowed", "That page does not take this kind of request.")}
        title, message = titles.get(exc.status_code, ("Request refused", str(exc.detail)))
        return console.error_page(request, ConsoleError(exc.status_code, title, message))

    async def server_error(request: Request, exc: Exception):
        log.exception("console: %s %s failed", request.method, request.url.path)
        return console.error_page(request, ConsoleError(
            500, "The console failed", "Something went wrong in the console while making this "
                                       "page; its log says what. Nothing was started."))

    app = Starlette(routes=routes, debug=False, exception_handlers={
        ConsoleError: console_error, HTTPException: http_error, Exception: server_error})
    return security.Guard(app, token=console.settings.token,
                          loopback=is_loopback(console.settings.host), tls=console.settings.tls,
                          login_page=console.login_page)
