#!/usr/bin/env bash
# The installed wheel, per extra: build dpfed's wheel, install it into a fresh virtual
# environment for each extra (site, aggregator, all) and run that role's commands from outside
# the checkout, so nothing is found in the source tree that the wheel lacks (bundled data, kit
# templates, `dpfed bench`). Called by .ci/run after the tests; runs on its own too:
#   bash .ci/wheel_smoke.sh   (PYTHON=python3.11 picks the interpreter, EXTRAS="site" fewer extras)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# An isolated build (PEP 517) into a scratch folder: the checkout gains no build/ or egg-info.
"$python" -m build --wheel --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/dpfed-*.whl)
echo "wheel-smoke: built $(basename "$wheel")"

free_port() {
    "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A federation made with this environment's own `dpfed provision` (kit templates from the
# wheel) and a hospital's data from `dpfed data export` (GDSC data from the wheel).
make_federation() {
    local port=$1
    cat >"$work/run/project.toml" <<TOML
federation = "smoke"
sites = ["hospital-a"]
coordinators = ["coordinator"]
[aggregator]
address = "127.0.0.1:$port"
listen = "127.0.0.1:$port"
TOML
    dpfed provision --project project.toml --out fed >/dev/null
    dpfed data export --sites hospital-a --out fed/sites/hospital-a/data >/dev/null
    sed -i 's#data/CHANGE-ME.csv#data/hospital-a.csv#' fed/sites/hospital-a/site.toml
}

smoke_common() {
    dpfed --version
    dpfed --help >/dev/null
    python -c 'import dpfed, dpfed_apps, sys; assert "site-packages" in dpfed.__file__, dpfed.__file__'
    # A coordinator's core: choose bounds with no extra needed.
    dpfed choose-bounds --n 200 --d 3 --epsilon 1 --datasets 2 --noise-draws 2 --json >/dev/null
}

smoke_site() {
    dpfed site --help >/dev/null
    dpfed site serve --help >/dev/null
    if python -c 'import pymc' 2>/dev/null; then echo "the site extra installed PyMC" >&2; exit 1; fi
    make_federation "$(free_port)"
    dpfed site check --config fed/sites/hospital-a/site.toml | grep -q "ok: nothing was released"
}

smoke_aggregator() {
    dpfed aggregator --help >/dev/null
    dpfed aggregator serve --help >/dev/null
    local port
    port=$(free_port)
    make_federation "$port"
    dpfed aggregator serve --config fed/aggregator/aggregator.toml --log-level WARNING &
    local pid=$!
    local ok=1
    for _ in $(seq 60); do
        if dpfed health --config fed/coordinators/coordinator/coordinator.toml >/dev/null 2>&1; then
            ok=0; break
        fi
        sleep 1
    done
    kill "$pid"; wait "$pid" || true
    [ "$ok" = 0 ] || { echo "the aggregator never answered its health check" >&2; exit 1; }
}

smoke_all() {
    dpfed bench round --help >/dev/null
    dpfed bench round --sites 3 --dim 4 --json >/dev/null
    dpfed simulate --sites 2 --draws 200 --fit-method plug-in-fixed --json >/dev/null
    smoke_console
}

# The console (in [all]) from the wheel: its templates and static files are installed; it
# prints its access token once with its URL and refuses every page without it (also on
# loopback); with the token and no aggregator running its pages say so (503) instead of failing.
smoke_console() {
    make_federation "$(free_port)"
    local port
    port=$(free_port)
    dpfed console --config fed/coordinators/coordinator/coordinator.toml --port "$port" \
        --log-level ERROR >console.out &
    local pid=$!
    local ok=1
    for _ in $(seq 30); do
        if python - "$port" <<'PY' 2>/dev/null
import re, sys, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
token = re.search(r"[?]token=([A-Za-z0-9_-]+)", open("console.out").read()).group(1)
try:
    urllib.request.urlopen(base + "/rounds/new", timeout=5)
    raise SystemExit("a page answered without the token")
except urllib.error.HTTPError as exc:
    assert exc.code in (401, 403)
def get(path):
    req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
    return urllib.request.urlopen(req, timeout=30)
assert "Start a round" in get("/rounds/new").read().decode()
assert b"--accent" in get("/static/console.css").read()
try:
    get("/sites")
    raise SystemExit("the sites page answered without an aggregator")
except urllib.error.HTTPError as exc:
    assert exc.code == 503 and b"cannot be reached" in exc.read()
PY
        then ok=0; break; fi
        sleep 1
    done
    kill -INT "$pid"; wait "$pid" || true
    [ "$ok" = 0 ] || { echo "dpfed console did not serve its pages" >&2; exit 1; }
}

for extra in ${EXTRAS:-site aggregator all}; do
    echo "wheel-smoke: dpfed[$extra]"
    "$python" -m venv "$work/venv-$extra"
    "$work/venv-$extra/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$wheel[$extra]"
    rm -rf "$work/run"; mkdir "$work/run"
    # Outside the checkout, without PYTHONPATH: only what the wheel installed is importable.
    (
        cd "$work/run"
        unset PYTHONPATH
        export PATH="$work/venv-$extra/bin:$PATH"
        smoke_common
        "smoke_$extra"
    )
done
echo "wheel-smoke: ok"
