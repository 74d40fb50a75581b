#!/usr/bin/env bash
# Install everything the test suite needs into a project virtualenv, then run it all.
# Used by the README and by CI (.ci/run). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${FLEET_VENV:-.venv}"
PY="${PYTHON:-python3}"

# Debian tools the suite uses (kubectl 1.32 comes with these machines): the
# OCI runtime, a static busybox for test images, nftables and iproute2 for pod
# networking, util-linux for nsenter, a registry to pull images from, and nginx
# (the ingress' nginx engine) with curl to reach it; e2fsprogs, xfsprogs and
# losetup (package mount) for the local.fleet.dev storage driver.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    need=()
    command -v sqlite3 >/dev/null || need+=(sqlite3)
    command -v runc >/dev/null || need+=(runc)
    [ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx httpd || need+=(busybox-static)
    command -v nft >/dev/null || need+=(nftables)
    command -v ip >/dev/null || need+=(iproute2)
    command -v nsenter >/dev/null || need+=(util-linux)
    command -v docker-registry >/dev/null || need+=(docker-registry)
    command -v nginx >/dev/null || need+=(nginx)
    command -v curl >/dev/null || need+=(curl)
    command -v mkfs.ext4 >/dev/null && command -v resize2fs >/dev/null || need+=(e2fsprogs)
    command -v mkfs.xfs >/dev/null && command -v xfs_growfs >/dev/null || need+=(xfsprogs)
    command -v losetup >/dev/null || need+=(mount)
    if [ "${#need[@]}" -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e '.[test]'

lint=(fleet tests)
[ -d bench ] && lint+=(bench)
"$VENV/bin/ruff" check "${lint[@]}"
# Per-test timings of the last run (where the suite spends its time): ${FLEET_JUNIT}.
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=40 \
    --junitxml="${FLEET_JUNIT:-/tmp/fleet-junit.xml}" "$@"
