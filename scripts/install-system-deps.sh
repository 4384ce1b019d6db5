#!/usr/bin/env bash
# Install the system packages fabric's tests and benchmarks use, when missing.
#
#   fuse3 libfuse3-dev     FUSE mounts (fusermount3, libfuse3.so)
#   restic rsync rclone    benchmark peers
#   s3fs                   s3fs-fuse, a benchmark peer (bench_checkpoint.py)
#   postgresql             PostgreSQL catalog tests (only if no initdb anywhere)
#   procps                 ps/pkill used by tests and scripts
#   prometheus systemd     promtool and systemd-analyze check deploy/ (tests/test_deploy.py)
#   chromium               the headless browser of the web console's tests (tests/test_console.py, playwright)
#   python3-venv           only if `python3 -m venv` cannot work (Debian splits it out)
#
# As root with apt-get: installs what is missing (one `apt-get update`, skipped
# when nothing is missing). Otherwise: prints what is missing and exits 0.
# Idempotent; takes well under a second when everything is present.
# A failure to install fuse3, postgresql, procps, prometheus, systemd, chromium or python3-venv is an error;
# the benchmark peers (restic, rsync, s3fs) and libfuse3-dev only warn; rclone is a test peer (S3).
set -euo pipefail

PY="${PY:-python3}"
OPTIONAL=" restic rsync s3fs libfuse3-dev "

log() { printf 'install-system-deps: %s\n' "$*" >&2; }

have_pkg() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

have_initdb() {
  command -v initdb >/dev/null 2>&1 && return 0
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d="$(pg_config --bindir 2>/dev/null || true)"
    [ -n "$d" ] && [ -x "$d/initdb" ] && return 0
  fi
  for d in /usr/lib/postgresql/*/bin /usr/pgsql-*/bin; do
    [ -x "$d/initdb" ] && return 0
  done
  return 1
}

have_venv() {
  command -v "$PY" >/dev/null 2>&1 || return 0  # no python: not our business here
  "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1
}

# package -> "present?" check. Prefer the command a package provides (works on
# non-Debian systems too), fall back to dpkg.
missing=()
check() {
  local pkg="$1" probe="$2"
  if eval "$probe" >/dev/null 2>&1; then return 0; fi
  if command -v dpkg-query >/dev/null 2>&1 && have_pkg "$pkg"; then return 0; fi
  missing+=("$pkg")
}

check fuse3        'command -v fusermount3'
check libfuse3-dev '[ -e /usr/include/fuse3/fuse.h ]'
check restic       'command -v restic'
check rsync        'command -v rsync'
check s3fs         'command -v s3fs'
check rclone       'command -v rclone'
check procps       'command -v ps && command -v pkill'
check prometheus   'command -v promtool'
check systemd      'command -v systemd-analyze'
check chromium     'command -v chromium'
have_initdb || missing+=(postgresql)
have_venv || missing+=(python3-venv)
# kubectl (it renders deploy/'s kustomize overlays) is not in Debian: it must come with the machine.
command -v kubectl >/dev/null 2>&1 || log "WARNING: kubectl is not installed (not in Debian); the deploy/ render tests will be skipped, or fail under CI"

# FUSE mounts also need the kernel's /dev/fuse: load the module when it is missing.
if [ ! -e /dev/fuse ] && [ "$(id -u)" -eq 0 ] && command -v modprobe >/dev/null 2>&1; then
  modprobe fuse 2>/dev/null || log "WARNING: /dev/fuse is missing and 'modprobe fuse' failed; FUSE tests will be skipped"
fi

if [ "${#missing[@]}" -eq 0 ]; then
  log "all system packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  log "missing (not installing: need root and apt-get): ${missing[*]}"
  log "tests needing them will be skipped"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -y -q -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300)

log "installing: ${missing[*]}"
"${APT[@]}" update || log "apt-get update failed; trying with the current package lists"

if "${APT[@]}" install --no-install-recommends "${missing[@]}"; then
  log "done"
  exit 0
fi

# Something failed: install one by one so one unavailable package (say rclone
# on an odd mirror) does not keep the others out.
log "bulk install failed; retrying package by package"
fatal=()
for p in "${missing[@]}"; do
  if "${APT[@]}" install --no-install-recommends "$p"; then continue; fi
  if [[ "$OPTIONAL" == *" $p "* ]]; then
    log "WARNING: could not install optional package $p"
  else
    fatal+=("$p")
  fi
done
if [ "${#fatal[@]}" -gt 0 ]; then
  log "ERROR: could not install: ${fatal[*]}"
  exit 1
fi
log "done (with warnings)"
