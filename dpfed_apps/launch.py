"""Start a ``dpfed`` command in a process that imported its modules ahead of time.

    python -m dpfed_apps.launch MODULE[,MODULE...] -- DPFED ARGS...

imports the listed modules and every command's module (what the command line's parser
imports), then waits for one line on stdin and runs ``dpfed ARGS`` (the same
``dpfed_apps.cli.main`` as the ``dpfed`` command, in the same process). End of input without
a line: exit 0, nothing run. ``LocalFederation`` starts the site processes this way together
and the aggregator this way before anything is written, so their imports (about a second
each) overlap the CA, the kits and the data being prepared: the aggregator gets "go" once its
config is written, each site once the aggregator answers its health check (a site dials a
listening aggregator at once instead of failing and backing off, site_node.client.Backoff).
Nothing a process does is different: only the moment its modules are imported.

Once the command has returned, the process waits for its non-daemon threads and ends without
the interpreter's teardown (``cli.exit_at_once``: logs and output flushed first): a site's
ledger and audit log commit every write as it is made (SQLite WAL, synchronous=FULL), and the
aggregator closes its store and audit log before ``serve`` returns, so there is nothing left to
write, and freeing NumPy, gRPC and OpenSSL took a stopping site 0.2-1 s, most of
``dpfed simulate``'s stop (docs/benchmarks.md, "Start"); ``dpfed aggregator serve`` ends this
way from the command line too (``exit_at_once``).
"""

from __future__ import annotations

import sys
import threading


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[1] != "--":
        print("usage: python -m dpfed_apps.launch MODULE[,MODULE...] -- ARGS...",
              file=sys.stderr)
        return 2
    for name in filter(None, argv[0].split(",")):
        # __import__, not importlib.import_module: -X importtime lists what it loads
        # (tests/test_start_imports.py reads the processes' imports from it).
        __import__(name)
    from dpfed_apps import cli

    cli.build_parser()      # imports every command's module, as cli.main will
    if not sys.stdin.readline():
        return 0            # the simulation gave up before the start: nothing to run
    return cli.main(argv[2:])


def _exit_when_done(code: int) -> None:
    """End the process with ``code`` once every non-daemon thread has finished, without the
    interpreter's teardown (module docstring)."""
    from dpfed_apps import cli

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    cli.exit_at_once(code)


if __name__ == "__main__":
    _exit_when_done(main())
