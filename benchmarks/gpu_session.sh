#!/usr/bin/env bash
# The measurements a first session on a GPU (or NPU) machine owes the open checks, in one
# command that fits a 10-minute call (docs/performance.md, "First session on a GPU"):
#   1. the device as hwbench sees it (`hwbench devices`), and its measured ceilings (`hwbench
#      calibrate`: GEMM rate per precision, copy bandwidth) into OUTDIR/calibration.json, which the
#      runs below read ($HWBENCH_CALIBRATION), so they carry mfu_measured_ceiling beside mfu;
#   2. `hwbench run --device DEVICE --model 345m --precision bf16`: the foundation's GPU check;
#   3. `hwbench sweep published-1dev`: the published workloads with their published settings on
#      one device (the planner records what it predicts does not fit as skipped);
#   4. `hwbench report` of 2 and 3 against results/published, Markdown and HTML: measured rows
#      under the published Table 2/3 rows, per device, and each run's peak memory beside the
#      planner's prediction (the planner's accuracy check);
#   5. `hwbench system` of the first result.
# Everything lands in OUTDIR (default ./gpu-session): results/ and results.tar.gz (every result and log),
# report.md, report.html, system.json, calibration.json, session.log. Nothing here needs the network or an
# install: `python3 -m hwbench` runs from this checkout (PYTHONPATH), so a machine with torch,
# pandas, tabulate, matplotlib, PyYAML and tokenizers can run it as it is.
#
#   benchmarks/gpu_session.sh [OUTDIR]
#   benchmarks/gpu_session.sh gpu-session; cp gpu-session/*.* "$OUT"/   # on the device tool: 6 files back
#   HWBENCH_DEVICE=npu benchmarks/gpu_session.sh      # an Ascend machine
#   HWBENCH_DEVICE=cpu HWBENCH_SUITE=smoke HWBENCH_MODEL=tiny benchmarks/gpu_session.sh  # the mechanics, on a CPU
set -uo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-gpu-session}" && cd "${1:-gpu-session}" && pwd)" || { echo "cannot use ${1:-gpu-session}" >&2; exit 2; }
device="${HWBENCH_DEVICE:-cuda}"
suite="${HWBENCH_SUITE:-published-1dev}"
model="${HWBENCH_MODEL:-345m}"
precision="${HWBENCH_PRECISION:-bf16}"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HWBENCH_CALIBRATION="$out/calibration.json"
hw() { python3 -m hwbench "$@"; }
log="$out/session.log"
status=0
step() {  # step NAME COMMAND...: run, log, remember a failure, go on
  local name="$1"; shift
  echo "== $name: $*" | tee -a "$log"
  local started=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - started)) s" | tee -a "$log"
  [ "$rc" -eq 0 ] || status=1
}

cd "$here"
: > "$log"
results="$out/results"
mkdir -p "$results/run"
step devices hw devices
if [ -s "$HWBENCH_CALIBRATION" ]; then  # a second call resumes: the ceilings are measured once
  echo "== calibrate: kept $HWBENCH_CALIBRATION" | tee -a "$log"
elif [ "$device" = cpu ]; then  # the mechanics on a CPU: small sizes
  step calibrate hw calibrate --device cpu --sizes 256,512 --copy-size 64MiB --repeats 5
else
  step calibrate hw calibrate --device "$device"
fi
if ls "$results"/run/*.json >/dev/null 2>&1; then  # a second call resumes: no second copy of this run
  echo "== run: kept $(ls "$results"/run/*.json | head -n 1)" | tee -a "$log"
else
  step run hw run --device "$device" --model "$model" --precision "$precision" --data synthetic \
    --eval-iters 0 --out "$results/run"
fi
step sweep hw sweep "$suite" --device "$device" --out "$results/sweep"
step report-md hw report "$results" --against "$here/results/published" --format md --out "$out/report.md"
step report-html hw report "$results" --against "$here/results/published" --format html --out "$out/report.html"
first="$(ls "$results"/run/*.json 2>/dev/null | head -n 1)"
if [ -n "$first" ]; then
  step system hw system "$first" --out "$out/system.json"
fi
tar -czf "$out/results.tar.gz" -C "$out" results || status=1  # results/ kept: the same command resumes
echo "== done: exit $status; files in $out" | tee -a "$log"
exit "$status"
