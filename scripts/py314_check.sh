#!/usr/bin/env bash
# perfmon inject's tests under a real CPython 3.14 (sys.remote_exec, PEP 768), on a host whose own
# Python is older: a Debian sid chroot with python3.14, a venv in it with torch and perfmon installed
# (editable) from this checkout, then tests/unit/test_inject.py, tests/integration/test_inject.py and
# tests/integration/test_inject_job.py run there; a table of each test's outcome at the end. Re-running reuses the chroot and the venv.
#
#   sudo scripts/py314_check.sh              # build or reuse /work/py314root, install, test
#   PY314_ROOT=/srv/py314 sudo scripts/py314_check.sh
#   sudo scripts/py314_check.sh -k remote    # extra arguments go to pytest
#
# Needs root (debootstrap, chroot, mounts), network access to deb.debian.org and PyPI, ~8 GB of disk
# (PyPI's torch for cp314 is the CUDA build: its nvidia-* dependencies are installed, and unused
# without a GPU). The venv deliberately lacks hypno: the remote-exec method must not need it, and the
# ptrace cases skip saying so.
set -euo pipefail

ROOT=${PY314_ROOT:-/work/py314root}
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=/opt/perfmon-py314
TORCH=${PY314_TORCH:-torch==2.13.0}
APT=(apt-get -q -o Acquire::Check-Valid-Until=false)   # a sid Release file may look expired to a clock ahead of it

if [[ $(id -u) != 0 ]]; then
    echo "py314_check: needs root (debootstrap, chroot, mounts)" >&2
    exit 2
fi

if [[ ! -x $ROOT/usr/bin/python3.14 || ! -x $ROOT/usr/bin/python3.13 ]]; then
    if [[ ! -x $ROOT/usr/bin/apt-get ]]; then
        command -v debootstrap >/dev/null || apt-get install -y -q debootstrap
        debootstrap --variant=minbase sid "$ROOT" http://deb.debian.org/debian
    fi
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    chroot "$ROOT" "${APT[@]}" update
    chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y python3.14 python3.14-venv \
        python3.13-minimal      # another minor version, for the version-mismatch refusal
fi

mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" || true; done
}
trap cleanup EXIT
bind() {   # bind host path $1 at the same path in the chroot
    mkdir -p "$ROOT$1"
    if ! mountpoint -q "$ROOT$1"; then
        mount --rbind "$1" "$ROOT$1"
        mounted+=("$ROOT$1")
    fi
}
bind /proc
bind /sys
bind /dev
bind "$REPO"
cp /etc/resolv.conf /etc/hosts "$ROOT/etc/"     # torchrun's rendezvous resolves this host's name
# the host's CA bundle (a TLS-inspecting proxy's certificate included) for pip in the chroot
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/host-ca-bundle.crt"

in_root() {
    chroot "$ROOT" env -i PATH=$VENV/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
        PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}

if [[ ! -x $ROOT$VENV/bin/python ]]; then
    in_root python3.14 -m venv "$VENV"
fi
if ! in_root python -c "import torch" 2>/dev/null; then
    in_root pip install -q "$TORCH" numpy
fi
in_root pip install -q pytest pytest-timeout pytest-asyncio pytest-cov pytest-randomly jsonschema
in_root pip install -q --no-build-isolation -e "$REPO" 2>/dev/null || in_root pip install -q -e "$REPO"

echo "== $(in_root python -VV)"
echo "== torch $(in_root python -c 'import torch; print(torch.__version__)'), hypno: $(in_root python -c \
    'import importlib.util as u; print("installed" if u.find_spec("hypno") else "not installed")')"
echo "== sys.is_remote_debug_enabled(): $(in_root python -c 'import sys; print(sys.is_remote_debug_enabled())')"

XML=/tmp/perfmon-py314-inject.xml
status=0
in_root bash -c "cd '$REPO' && python -m pytest -q -p no:randomly --no-cov -p no:cacheprovider -rs \
    --junitxml=$XML tests/unit/test_inject.py tests/integration/test_inject.py tests/integration/test_inject_job.py $*" || status=$?

in_root python - "$XML" <<'EOF'
import sys
import xml.etree.ElementTree as ET

rows = []
for case in ET.parse(sys.argv[1]).iter("testcase"):
    outcome, why = "passed", ""
    for tag in ("failure", "error", "skipped"):
        found = case.find(tag)
        if found is not None:
            outcome, why = tag, (found.get("message") or "").splitlines()[0][:90] if found.get("message") else ""
    rows.append(("/".join(case.get("classname").split(".")[-2:]) + "::" + case.get("name"), outcome,
                 f"{float(case.get('time', 0)):.1f}", why))
width = max(len(r[0]) for r in rows)
print(f"\n{'test (Python ' + sys.version.split()[0] + ')':<{width}}  outcome  seconds  note")
for name, outcome, secs, why in rows:
    print(f"{name:<{width}}  {outcome:<7}  {secs:>7}  {why}")
counts = {o: sum(r[1] == o for r in rows) for o in ("passed", "failure", "error", "skipped")}
print(", ".join(f"{n} {o}" for o, n in counts.items() if n))
EOF
exit $status
