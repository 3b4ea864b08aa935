"""Start a ``dpfed`` command in a process that imported its modules ahead of time.

    python -m dpfed_apps.launch MODULE[,MODULE...] -- DPFED ARGS...

imports the listed modules, then waits for one line on stdin and runs ``dpfed ARGS`` (the
same ``dpfed_apps.cli.main`` as the ``dpfed`` command, in the same process). End of input
without a line: exit 0, nothing run. ``LocalFederation`` starts the site processes this way
together with the aggregator, so their imports (about a second each) overlap the aggregator's
start, and says "go" once the aggregator answers its health check: a site dials a listening
aggregator at once instead of failing and backing off (site_node.client.Backoff). Nothing a
site does is different: only the moment its modules are imported.
"""

from __future__ import annotations

import importlib
import sys

def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[1] != "--":
        print("usage: python -m dpfed_apps.launch MODULE[,MODULE...] -- ARGS...",
              file=sys.stderr)
        return 2
    for name in filter(None, argv[0].split(",")):
        importlib.import_module(name)
    if not sys.stdin.readline():
        return 0            # the simulation gave up before the start: nothing to run
    from dpfed_apps import cli

    return cli.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main())
