#!/usr/bin/env bash
# Run the benchmarks of bench/ and print the figures (markdown) on stdout.
#
#   bash bench/run_all.sh                 # full size: 1.25 GiB v1/v2, 100,000-file tree, 3 rounds + 1 warm-up
#   bash bench/run_all.sh --quick         # 1/10 data set, 5,000-file tree, 1 round, no warm-up (smoke test)
#   bash bench/run_all.sh --runs 5        # more counted rounds
#   bash bench/run_all.sh --only ingest   # or: --only commit|remote|spoke|checkpoint|s3|bwlimit|fuse|fsspec
#                                         # (s3, bwlimit, fuse and fsspec run only when named)
#   bash bench/run_all.sh --rev HEAD      # measure a committed revision: `git archive` of it into
#                                         # bench/work/src/<rev>/, immune to edits of the working tree
#   bash bench/run_all.sh --priority      # on a shared machine: run in a new session whose scheduler
#                                         # autogroup gets nice -19 (root), so other sessions' load
#                                         # disturbs the figures less (plain `nice` does not cross autogroups)
#
# Environment: PYTHON (interpreter with fabric's dependencies; default: python3
# on PATH, which `make bench` points at .venv), SEED (data set seed, default 1).
# Data sets are generated once under bench/work/data/ (gitignored) and reused;
# throwaway stores go to bench/work/stores/; figures (JSON + markdown) to
# bench/work/results/<timestamp>/. restic must be on PATH for the ingest benchmark.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
work="$here/work"
PYTHON="${PYTHON:-python3}"
SEED="${SEED:-1}"
args=("$@")
quick=0
priority=0
runs=""
warmup=""
only=""
rev=""

while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --runs) runs="$2"; shift ;;
    --warmup) warmup="$2"; shift ;;
    --only)
      only="$2"; shift
      case "$only" in
        ingest|commit|remote|spoke|checkpoint|s3|bwlimit|fuse|fsspec) ;;
        *) echo "run_all.sh: --only takes ingest, commit, remote, spoke, checkpoint, s3, bwlimit, fuse or fsspec (not '$only')" >&2; exit 2 ;;
      esac ;;
    --rev) rev="$2"; shift ;;
    --priority) priority=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "run_all.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$priority" = 1 ] && [ -z "${BENCH_PRIORITY:-}" ]; then
  export BENCH_PRIORITY=1
  # shellcheck disable=SC2016
  exec setsid -w bash -c 'if ! echo -19 > /proc/$$/autogroup 2>/dev/null; then
      echo "run_all.sh: could not raise the autogroup priority (needs root); running at normal priority" >&2
      export BENCH_PRIORITY=failed; fi
    exec bash "$0" "$@"' "$0" "${args[@]}"
fi

if ! "$PYTHON" -c 'import blake3, pyfastcdc, zstandard, xxhash, click' 2>/dev/null; then
  echo "run_all.sh: $PYTHON lacks fabric's dependencies; set PYTHON=/path/to/venv/bin/python (or run make bench)" >&2
  exit 2
fi

if [ "$quick" = 1 ]; then
  vargs=(--quick); vdir="$work/data/versions-quick-s$SEED"
  tfiles=5000; tdir="$work/data/tree-5k-s$SEED"
  runs="${runs:-1}"; warmup="${warmup:-0}"
else
  vargs=(); vdir="$work/data/versions-s$SEED"
  tfiles=100000; tdir="$work/data/tree-100k-s$SEED"
  runs="${runs:-3}"; warmup="${warmup:-1}"
fi

if [ -n "$rev" ]; then
  full="$(git -C "$root" rev-parse --verify "$rev^{commit}")"
  export FABRIC_REV="${full:0:12}"
  export FABRIC_SRC="$work/src/$FABRIC_REV"
  if [ ! -d "$FABRIC_SRC/fabric" ]; then
    mkdir -p "$FABRIC_SRC.tmp"
    git -C "$root" archive "$full" | tar -x -C "$FABRIC_SRC.tmp"
    mv "$FABRIC_SRC.tmp" "$FABRIC_SRC"
  fi
  rev_note="$FABRIC_REV (--rev $rev, snapshot in bench/work/src/)"
else
  rev_note="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?') (working tree$(git -C "$root" status --porcelain --untracked-files=no -- fabric | grep -q . && echo ', with uncommitted changes under fabric/' || true))"
fi

stamp="$(date +%Y%m%d-%H%M%S)"
out="$work/results/$stamp$([ "$quick" = 1 ] && echo -quick || true)"
mkdir -p "$out" "$work/stores"
cd "$root"

echo "# fabric benchmarks, $(date '+%Y-%m-%d %H:%M %Z')" | tee "$out/report.md"
{
  echo
  echo "- machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -sr)"
  echo "- python: $("$PYTHON" -V 2>&1) ($PYTHON); fabric at $rev_note"
  command -v restic >/dev/null && echo "- $(restic version)"
  echo "- mode: $([ "$quick" = 1 ] && echo quick || echo full), $runs counted round(s) after $warmup warm-up round(s), seed $SEED"
  echo "- load: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15-min load average at start)$([ "${BENCH_PRIORITY:-}" = 1 ] && echo "; run with --priority (autogroup nice -19)" || true)"
  echo "- command: PYTHON=$PYTHON bash bench/run_all.sh $([ "$quick" = 1 ] && echo '--quick ' || true)$([ -n "$rev" ] && echo "--rev $rev " || true)--runs $runs --warmup $warmup$([ -n "$only" ] && echo " --only $only" || true)$([ "$priority" = 1 ] && echo " --priority" || true)"
  echo
} | tee -a "$out/report.md"

if [ -z "$only" ] || [ "$only" = ingest ]; then
  if ! command -v restic >/dev/null; then
    echo "run_all.sh: restic is not on PATH; skipping the ingest benchmark" >&2
  else
    "$PYTHON" "$here/gen_dataset.py" versions --out "$vdir" --seed "$SEED" "${vargs[@]}"
    "$PYTHON" "$here/bench_ingest.py" --dataset "$vdir" --work "$work/stores" --runs "$runs" --warmup "$warmup" \
      --python "$PYTHON" --json-out "$out/ingest.json" --md-out "$out/ingest.md" >/dev/null
    { echo "## Ingest (fabric import vs restic backup)"; echo; cat "$out/ingest.md"; echo; } | tee -a "$out/report.md"
  fi
fi

if [ -z "$only" ] || [ "$only" = commit ]; then
  "$PYTHON" "$here/gen_dataset.py" tree --out "$tdir" --seed "$SEED" --files "$tfiles"
  "$PYTHON" "$here/bench_commit.py" --tree "$tdir" --work "$work/stores" --runs "$runs" --warmup "$warmup" \
    --seed "$SEED" --python "$PYTHON" --json-out "$out/commit.json" --md-out "$out/commit.md" >/dev/null
  { echo "## Commit (initial commit vs 10 changed files)"; echo; cat "$out/commit.md"; echo; } | tee -a "$out/report.md"
fi

# --only remote: fabric import over HTTP vs an rsync daemon (bytes at a proxy); --only spoke: reads through a spoke over a 50 ms WAN vs rsync/rclone
if [ -z "$only" ] || [ "$only" = remote ]; then
  "$PYTHON" "$here/gen_dataset.py" versions --out "$vdir" --seed "$SEED" "${vargs[@]}"
  "$PYTHON" "$here/bench_remote.py" --dataset "$vdir" --work "$work/stores" --runs "$runs" --python "$PYTHON" "${vargs[@]}" \
    --json-out "$out/remote.json" --md-out "$out/remote.md" >/dev/null
  { echo "## Remote import (fabric import to a hub vs rsync to a daemon)"; echo; cat "$out/remote.md"; echo; } | tee -a "$out/report.md"
fi
if [ -z "$only" ] || [ "$only" = spoke ]; then
  "$PYTHON" "$here/gen_dataset.py" versions --out "$vdir" --seed "$SEED" "${vargs[@]}"
  "$PYTHON" "$here/bench_spoke.py" --dataset "$vdir" --work "$work/stores" --runs "$runs" --seed "$SEED" --python "$PYTHON" "${vargs[@]}" \
    --json-out "$out/spoke.json" --md-out "$out/spoke.md" >/dev/null
  { echo "## Reads through a spoke over a WAN (vs rsync and rclone)"; echo; cat "$out/spoke.md"; echo; } | tee -a "$out/report.md"
fi

# --only checkpoint: checkpoint writes through a spoke mount over a WAN vs rclone mount and the local disk (FUSE, rclone)
if [ -z "$only" ] || [ "$only" = checkpoint ]; then
  if ! command -v rclone >/dev/null || ! command -v fusermount3 >/dev/null || [ ! -e /dev/fuse ]; then
    echo "run_all.sh: the checkpoint benchmark needs rclone, fusermount3 and /dev/fuse; skipping it" >&2
  else
    "$PYTHON" "$here/bench_checkpoint.py" --work "$work/stores" --runs "$runs" --python "$PYTHON" "${vargs[@]}" \
      --json-out "$out/checkpoint.json" --md-out "$out/checkpoint.md" >/dev/null
    { echo "## Checkpoint writes through a spoke mount over a WAN (vs rclone mount and local disk)"; echo; cat "$out/checkpoint.md"; echo; } | tee -a "$out/report.md"
  fi
fi

# --only s3: S3 GET throughput of the hub and a warm spoke vs moto (bench_s3.py)
if [ "$only" = s3 ]; then
  "$PYTHON" "$here/bench_s3.py" --work "$work/stores" --python "$PYTHON" --rounds "$runs" "${vargs[@]}" \
    --json-out "$out/s3.json" --md-out "$out/s3.md" >/dev/null
  { echo "## S3 GET throughput (hub and spoke vs moto)"; echo; cat "$out/s3.md"; echo; } | tee -a "$out/report.md"
fi

# --only bwlimit: how closely fabric --bwlimit holds a cap, vs rsync --bwlimit (bench_bwlimit.py)
if [ "$only" = bwlimit ]; then
  "$PYTHON" "$here/bench_bwlimit.py" --runs "$runs" --python "$PYTHON" | tee "$out/bwlimit.txt"
  { echo "## Bandwidth caps (fabric --bwlimit vs rsync --bwlimit)"; echo; sed -n '/^| cap/,$p' "$out/bwlimit.txt"; echo; } | tee -a "$out/report.md"
fi

# --only fuse: reads through a fabric mount vs an rclone mount vs the local directory (bench_fuse.py)
if [ "$only" = fuse ]; then
  if ! command -v rclone >/dev/null || ! command -v fusermount3 >/dev/null || [ ! -e /dev/fuse ]; then
    echo "run_all.sh: the fuse benchmark needs rclone, fusermount3 and /dev/fuse" >&2
    exit 2
  fi
  if [ "$quick" = 1 ]; then fargs=(--large-files 1 --small-files 400); else fargs=(); fi
  "$PYTHON" "$here/bench_fuse.py" --work "$work" --runs "$runs" --seed "$SEED" --python "$PYTHON" "${fargs[@]}" \
    --json-out "$out/fuse.json" --md-out "$out/fuse.md" >/dev/null
  { echo "## Reads through a mount (fabric vs rclone mount vs local directory)"; echo; cat "$out/fuse.md"; echo; } | tee -a "$out/report.md"
fi

# --only fsspec: fabric:// vs s3fs reading large files from a warm spoke, and the local disk (bench_fsspec.py)
if [ "$only" = fsspec ]; then
  if [ "$quick" = 1 ]; then fsargs=(--files 2 --mib 16); else fsargs=(); fi
  "$PYTHON" "$here/bench_fsspec.py" --rounds "$runs" --seed "$SEED" --python "$PYTHON" "${fsargs[@]}" \
    --json-out "$out/fsspec.json" --md-out "$out/fsspec.md" >/dev/null
  { echo "## Large files through fsspec from a warm spoke (fabric:// vs s3fs vs local disk)"; echo; cat "$out/fsspec.md"; echo; } | tee -a "$out/report.md"
fi

echo "figures: $out/" >&2
