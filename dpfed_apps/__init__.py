"""dpfed's applications: the ``dpfed`` command line and what it runs on one machine.

The top layer of docs/architecture.md. ``cli`` and ``commands`` (one module per subcommand),
``simulation`` (a whole federation on this machine), ``forecast`` (what a round would gain,
for ``dpfed plan``), ``bench`` (the round benchmark of ``dpfed bench``) and ``ca`` (the
federation's offline certificate authority, ``dpfed provision``). Applications import the core
(``dpfed``) and the roles (``site_node``, ``aggregator``, ``coordinator``); nothing below them
imports an application (enforced by the import-linter contracts in pyproject.toml).
"""
