"""``dpfed console``: a coordinator's web console (issue 13; docs/console.md).

One coordinator's view of its federation in a browser: the sites (connected, last seen,
epsilon spent round by round and in total, declared totals), the rounds (state, phases and
their times, who released, refused or dropped and why), results (posterior intervals as an
SVG plot, the quality statement, the forecast beside the realised result, the JSON), and
starting a round from a round.toml with a preview of the forecast and of the epsilon every
invited site will spend.

It is a client of the aggregator and nothing more: every figure comes over gRPC with the
coordinator's mutual-TLS identity (read-only RPCs, and StartRound signed with the
coordinator's key through ``coordinator.client.Coordinator``). It never imports the
aggregator's code nor opens its store (an import-linter contract checks it).

Modules: ``config`` (settings, the bind rules), ``views`` (RPC replies -> plain view
models, pure), ``plot`` (the interval plot as SVG, pure), ``data`` (the data-access layer:
RPCs -> view models, errors -> messages), ``forecasts`` (the forecast of a round, kept beside
the console), ``startround`` (spec upload -> preview -> start), ``security`` (access token,
CSRF, headers), ``app`` (routes, templates), ``server`` (uvicorn). Only ``app`` and
``server`` import the web stack (Starlette, uvicorn, Jinja2): ``config`` is read by the
command line without it.
"""
