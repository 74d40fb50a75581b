#!/usr/bin/env bash
# Install Fleet into a virtualenv and start a single-machine cluster (server with its
# built-in node agent; real runc containers when root), then run an example workload
# from a locally built image. The server stays in the foreground; Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${FLEET_VENV:-.venv}"
PY="${PYTHON:-python3}"
PORT="${FLEET_PORT:-9300}"

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    command -v runc >/dev/null || need+=(runc)
    /bin/busybox --list 2>/dev/null | grep -qx httpd || need+=(busybox-static)
    command -v nft >/dev/null || need+=(nftables)
    command -v ip >/dev/null || need+=(iproute2)
    if [ "${#need[@]}" -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e .

if [ -n "${FLEET_DATA_DIR:-}" ]; then DATA_DIR="$FLEET_DATA_DIR"
elif [ "$(id -u)" = 0 ]; then DATA_DIR=/var/lib/fleet
else DATA_DIR="${XDG_DATA_HOME:-$HOME/.local/share}/fleet"; fi
kc="$DATA_DIR/admin.kubeconfig"

"$VENV/bin/fleet" server --data-dir "$DATA_DIR" --port "$PORT" &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null' EXIT INT TERM

# Wait until the API answers and the built-in node has registered.
for _ in $(seq 1 150); do
    if [ -s "$kc" ] && "$VENV/bin/kfleet" --kubeconfig "$kc" get nodes --no-headers 2>/dev/null | grep -q Ready; then
        break
    fi
    sleep 0.2
done

image="$(mktemp -d)/busybox-fleet.tar"
"$VENV/bin/python" packaging/build_example_image.py "$image"
"$VENV/bin/kfleet" --kubeconfig "$kc" image import "$image"
"$VENV/bin/kfleet" --kubeconfig "$kc" apply -f packaging/examples/hello.yaml
for _ in $(seq 1 150); do
    "$VENV/bin/kfleet" --kubeconfig "$kc" get deployment hello --no-headers 2>/dev/null | grep -q " 2/2 " && break
    sleep 0.3
done
"$VENV/bin/kfleet" --kubeconfig "$kc" get nodes,deployments,pods -o wide
echo
echo "Cluster is up. In another shell:"
echo "  export KUBECONFIG=$kc"
echo "  kubectl get deploy,pods,svc -o wide; kubectl logs deploy/hello; kubectl exec deploy/hello -- wget -qO- localhost:8080"
echo "  kubectl exec deploy/hello -- nslookup hello; kubectl port-forward svc/hello 8081:80"
echo "  curl http://localhost:8080/    # through the ingress"
echo "  kubectl apply -f packaging/examples/counter.yaml; kubectl get pvc,pv    # a StatefulSet with its own volume"
wait "$server"
