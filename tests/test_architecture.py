"""One way through the code (docs/architecture.md): the import-linter contracts of
pyproject.toml hold, and they do fail when the code breaks them.

Contracts: applications (dpfed_apps, dpfed_apps.evaluation) over the roles (site_node |
aggregator | coordinator, independent of each other) over the fit (posterior) over the core
(dpfed); the core and the coordinator import nothing beyond the core dependencies; the site
never imports the fitting stack (posterior included); the aggregator never imports the
certificate authority (dpfed_apps.ca); the console is a gRPC client of the aggregator only (no
aggregator or site code, no sqlite3, no fitting stack, no posterior); no import cycles among
the children of any package (import-linter's acyclic_siblings). Every top-level package of the
checkout is a root package and sits in one layer (a folder is a layer).

And no module-level import cycle anywhere in the project's modules (grimp's import graph,
function-level imports included, strongly connected components by Tarjan's algorithm): a
test of its own, so a cycle is named module by module, and a detector that is shown to fail
on an injected cycle.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTLINTER = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]
# The project's packages: the contracts' root packages (dpfed, dpfed_apps, the roles, ...).
PACKAGES = tuple(IMPORTLINTER["root_packages"])
CONTRACT_NAMES = {
    "layers": "Applications over roles over the core; roles independent of each other",
    "core-deps": "The core and the coordinator need only the core dependencies",
    "site-no-fitting": "A site install never imports the fitting stack",
    "aggregator-no-ca": "The running aggregator never imports the certificate-authority tooling",
    "console-is-a-client": "The console talks to the aggregator only over gRPC as the coordinator",
    "no-cycles": "No import cycles among the modules and subpackages of any package",
}


def _in_tree(root: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter whose import path starts at ``root`` (the packages
    analysed are root's, not the ones this process imported)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` over the packages in ``root`` with ``root``'s pyproject.toml."""
    return _in_tree(root, "import sys; from importlinter.cli import lint_imports; "
                          "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, "
                          "no_logo=True))")


def _import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports directly (grimp.build_graph over PACKAGES in
    ``root``; imports inside functions and under TYPE_CHECKING count)."""
    code = ("import json, grimp\n"
            f"graph = grimp.build_graph(*{PACKAGES!r}, cache_dir=None)\n"
            "print(json.dumps({m: sorted(graph.find_modules_directly_imported_by(m))\n"
            "                  for m in sorted(graph.modules)}))\n")
    run = _in_tree(root, code)
    assert run.returncode == 0, run.stderr
    return {module: set(imported) for module, imported in json.loads(run.stdout).items()}


def import_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """The import cycles of ``graph``: one per strongly connected component with more than one
    module (or a module importing itself), as (its modules sorted, a shortest import path
    ``[a, b, ..., a]`` from the first of them back to it). Tarjan's algorithm, iterative (no
    recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            module, successors = work[-1]
            for nxt in successors:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1 or module in graph[module]:
                        components.append(sorted(component))
    return [(component, _cycle_through(graph, component)) for component in sorted(components)]


def _cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to itself, inside it."""
    first, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for module in frontier:
            for nxt in sorted(graph[module] & members):
                if nxt == first:
                    path = [module]
                    while path[-1] != first:
                        path.append(previous[path[-1]])
                    return [*reversed(path), first]
                if nxt not in previous:
                    previous[nxt] = module
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {component}")  # not reached: a component is one


def _describe(cycles: list[tuple[list[str], list[str]]]) -> str:
    return "; ".join(f"{{{', '.join(members)}}}, e.g. {' -> '.join(path)}"
                     for members, path in cycles)


def _copy_tree(tmp_path: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.csv.gz", "*.csv"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")


def _inject(tmp_path: Path, violations: dict[str, str]) -> None:
    for path, line in violations.items():
        with open(tmp_path / path, "a", encoding="utf-8") as fh:
            fh.write(f"\n{line}\n")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_import_contracts_hold():
    run = _lint_imports(ROOT)
    out = _flat(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    for name in CONTRACT_NAMES.values():
        assert name in out
    assert "6 kept, 0 broken" in out


def test_import_contracts_fail_on_a_violation(tmp_path):
    """A copy of the tree with one forbidden import per contract: lint-imports exits non-zero
    and reports each contract broken, naming the offending import."""
    _copy_tree(tmp_path)
    _inject(tmp_path, {
        "dpfed/statistics.py": "import site_node.release  # core -> role",
        "site_node/release.py": "import scipy.stats  # site -> fitting stack",
        "aggregator/identity.py": "import dpfed_apps.ca  # running aggregator -> CA tooling",
        "coordinator/client.py": "import aggregator.store  # role -> role",
        "dpfed_apps/console/data.py": "import sqlite3  # console -> the aggregator's database",
        # The fit is a layer of its own, below the roles: the core, a site install, the
        # console and (through its fitting stack) the coordinator never import it.
        "dpfed/noise.py": "import posterior.fit  # core -> the fit",
        "coordinator/roundspec.py": "import posterior  # coordinator -> the fit -> SciPy",
        "site_node/config.py": "import posterior  # site -> the fit",
        "dpfed_apps/console/plot.py": "import posterior.quality  # console -> the fit",
        # The experiment sits above the application libraries it uses.
        "dpfed_apps/forecast.py": "import dpfed_apps.evaluation.protocol  # library -> experiment",
        # The circle issue 20 removed: the shared vocabulary importing the node back.
        "site_node/messages.py": "import site_node.node  # node -> messages -> node",
    })
    run = _lint_imports(tmp_path)
    out = _flat(run.stdout)
    assert run.returncode != 0, out
    for name in CONTRACT_NAMES.values():
        assert f"{name}" in out
    assert "0 kept, 6 broken" in out, out
    assert "dpfed.statistics -> site_node.release" in out
    assert "site_node.release -> scipy" in out
    assert "aggregator.identity -> dpfed_apps.ca" in out
    assert "coordinator.client -> aggregator.store" in out
    assert "dpfed_apps.console.data -> sqlite3" in out
    assert "dpfed.noise -> posterior.fit" in out
    assert "coordinator.roundspec -> posterior" in out
    assert "site_node.config -> posterior" in out
    assert "dpfed_apps.console.plot -> posterior.quality" in out
    assert "dpfed_apps.forecast -> dpfed_apps.evaluation.protocol" in out
    assert "No cycles are allowed in site_node" in out
    assert ".messages -> .node" in out or ".node -> .messages" in out


def test_the_cycle_contract_covers_every_root_package():
    """A new top-level package is not left out of the no-cycles contract."""
    contract, = (c for c in IMPORTLINTER["contracts"] if c["id"] == "no-cycles")
    assert sorted(contract["ancestors"]) == sorted(PACKAGES)
    assert "skip_descendants" not in contract and "ignore_imports" not in contract


def test_every_top_level_package_is_one_layer():
    """A folder is a layer: every package at the top of the checkout is a root package of the
    contracts, and the layers contract places it, or each of its subpackages it names, in
    exactly one layer (no top-level package such as a former ``evaluation/`` left outside)."""
    top_level = {p.name for p in ROOT.iterdir()
                 if (p / "__init__.py").is_file() and p.name not in {"tests", "benchmarks"}}
    assert top_level == set(PACKAGES)
    contract, = (c for c in IMPORTLINTER["contracts"] if c["id"] == "layers")
    named = [m.strip() for layer in contract["layers"]
             for m in layer.replace("|", ":").split(":")]
    assert len(named) == len(set(named)), named
    for package in PACKAGES:
        assert package in named or any(m.startswith(package + ".") for m in named), package


def test_no_module_level_import_cycles():
    """No module of the project imports itself back through others (function-level imports
    count): a cycle is named module by module."""
    graph = _import_graph(ROOT)
    assert {"site_node.node", "site_node.client", "site_node.secure"} <= set(graph)
    cycles = import_cycles(graph)
    assert not cycles, f"import cycle(s): {_describe(cycles)}"


def test_the_cycle_check_fails_on_an_injected_cycle(tmp_path):
    """The detector itself: on a copy of the tree with two cycles injected (one in a role,
    one in the core, one of them through a function-level import), it finds both and names
    them; on small graphs, it finds what Tarjan's algorithm should."""
    _copy_tree(tmp_path)
    _inject(tmp_path, {
        "site_node/messages.py": "import site_node.node  # node -> messages -> node",
        "dpfed/wire/canonical.py": ("def _later():\n"
                                    "    import dpfed.wire.signing  # signing -> canonical"),
    })
    cycles = import_cycles(_import_graph(tmp_path))
    assert _describe(cycles) == (
        "{dpfed.wire.canonical, dpfed.wire.signing}, "
        "e.g. dpfed.wire.canonical -> dpfed.wire.signing -> dpfed.wire.canonical; "
        # messages -> node closes a circle through every module of the site that uses messages
        "{site_node.client, site_node.messages, site_node.node, site_node.secure}, "
        "e.g. site_node.client -> site_node.messages -> site_node.node -> site_node.client"
    ), _describe(cycles)
    # Small graphs: a longer circle, a self-import, two components, none.
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [
        (["a", "b", "c"], ["a", "b", "c", "a"])]
    assert import_cycles({"a": {"a"}, "b": set()}) == [(["a"], ["a", "a"])]
    assert import_cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}) == [
        (["a", "b"], ["a", "b", "a"]), (["c", "d"], ["c", "d", "c"])]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set(), "x": {"b", "zz"}}) == []
