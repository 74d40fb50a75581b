#!/usr/bin/env bash
# Install Fleet into a virtualenv and start a single-machine cluster with an example workload.
# The server keeps running in the foreground; Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${FLEET_VENV:-.venv}"
PY="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e .

DATA_DIR="${FLEET_DATA_DIR:-}"
args=()
[ -n "$DATA_DIR" ] && args+=(--data-dir "$DATA_DIR")
"$VENV/bin/fleet" server "${args[@]}" &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT INT TERM

if [ -n "$DATA_DIR" ]; then kc="$DATA_DIR/admin.kubeconfig"
elif [ "$(id -u)" = 0 ]; then kc=/var/lib/fleet/admin.kubeconfig
else kc="${XDG_DATA_HOME:-$HOME/.local/share}/fleet/admin.kubeconfig"; fi
for _ in $(seq 1 100); do
    [ -s "$kc" ] && "$VENV/bin/python" -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:${FLEET_PORT:-9300}/readyz').status_code != 200)" 2>/dev/null && break
    sleep 0.2
done
"$VENV/bin/kfleet" --kubeconfig "$kc" apply -f packaging/examples/web.yaml
"$VENV/bin/kfleet" --kubeconfig "$kc" get all
echo
echo "Cluster is up. In another shell: export KUBECONFIG=$kc; kubectl get all"
wait "$server"
