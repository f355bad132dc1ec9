#!/usr/bin/env bash
# The measurements a GPU (or NPU) session owes the open checks, in stages that resume, so that a
# loan of a card runs what its device time holds and the next loan goes on (benchmarks/README.md,
# "The GPU session", has the plan for 15 minutes of device time):
#   probe   `hwbench devices`; `hwbench calibrate` (the measured GEMM and copy ceilings, into
#           SESSION/calibration.json, which every later run reads); a 3-step tiny run on the
#           device and `hwbench system` of it (system.json); on CUDA, benchmarks/cuda_context_probe.py
#           (does asking a GPU's properties leave a context; does NVML list us under our own pid)
#   fast    `hwbench sweep fast` (HWBENCH_FAST_SUITE): 345M at seq 1024 and 1.3B at seq 2048, bf16,
#           the published settings beside --settings fast: the MFU goals
#   run     benchmarks/side_by_side.py on MODEL (345m) PRECISION (bf16): the bare PyTorch loop,
#           `hwbench run --no-telemetry` and `hwbench run`, twice (HWBENCH_RUN_REPEATS), and
#           their ratios (side_by_side.json): the harness and telemetry goals
#   sweep   `hwbench sweep SUITE` (published-1dev: the published workloads, published settings,
#           one device; the planner skips what does not fit)
#   batch   `hwbench sweep speed-1.3b` (HWBENCH_BATCH_SUITE): 1.3B at seq 2048, bf16, micro batch
#           candidates with and without recompute
#   fp8     `hwbench sweep fp8` (HWBENCH_FP8_SUITE): Llama 3.2 1B and 3B at seq 8192 on one card, bf16
#           beside FP8 tensorwise and rowwise, compiled: the FP8 speed-up, its MFU against the BF16
#           peak, and the loss beside the BF16 run's
#   report  `hwbench report` of this folder's results and of HWBENCH_EARLIER (earlier loans'
#           result folders, space-separated) against results/published (report.md, report.html:
#           per-device ratios to the published rows, the planner's prediction beside every peak)
#   all     probe fast run sweep batch fp8 report (a machine without a per-call limit)
# Every stage resumes: a sweep keeps its finished points, the side-by-side its finished repeats,
# the probe its calibration and run. Results stay in SESSION (default: gpu-session/ in this
# checkout, git-ignored), which a warm device machine keeps between calls. After every step the
# files that matter are copied to DEST (default: $OUT where it is set): session.log,
# results.tar.gz (all of SESSION's results and logs, remade each time), summary.md, system.json,
# side_by_side.json, report.md, report.html; 7 files, no folders, within the device tool's 8. So a
# call that runs out of time still returns everything finished before it. A step that would not
# end before the call's budget (HWBENCH_CALL_BUDGET, default 560 s from the script's start) is
# stopped with SIGTERM (a sweep then keeps every finished point) or, with less than
# HWBENCH_STEP_MIN (default 30 s) left, not started; the same stage in the next call goes on. The
# short table of every result comes last in the output, then each goal judged (PASS, FAIL, n/a).
#
#   benchmarks/gpu_session.sh probe fast run report      # a first session's call (timeout_s 600)
#   HWBENCH_CALL_BUDGET=150 benchmarks/gpu_session.sh probe fast run report   # the next call goes on
#   HWBENCH_DEVICE=npu benchmarks/gpu_session.sh all
#   HWBENCH_DEVICE=cpu HWBENCH_MODEL=tiny HWBENCH_PRECISION=fp32 HWBENCH_SUITE=smoke \
#     HWBENCH_FAST_SUITE=my-tiny-suite.yaml HWBENCH_BATCH_SUITE=my-tiny-suite.yaml \
#     HWBENCH_RUN_ARGS="--steps 2 --warmup 1" benchmarks/gpu_session.sh --dest /tmp/back all   # the mechanics, on a CPU
# Nothing here needs the network: `python3 -m hwbench` runs from this checkout (HWBENCH_PYTHON
# names another Python). The dependencies the device image lacks come as wheels in gpu-wheels/
# (benchmarks/gpu_wheels.sh makes it here; the device tool carries it): at the start of every
# call, unless their modules import already, pip installs them offline (--no-index) into
# gpu-site/ (HWBENCH_WHEELS, HWBENCH_SITE name others), which goes on PYTHONPATH.
set -uo pipefail

STAGES="probe, fast, run, sweep, batch, fp8, report, all"
usage() { echo "usage: gpu_session.sh [--dest DIR] STAGE... (stages: $STAGES)" >&2; exit 2; }
here="$(cd "$(dirname "$0")/.." && pwd)"
dest="${OUT:-}"
stages=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) [ $# -ge 2 ] || usage; dest="$2"; shift 2 ;;
    probe|fast|run|sweep|batch|fp8|report) stages+=("$1"); shift ;;
    all) stages+=(probe fast run sweep batch fp8 report); shift ;;
    *) echo "gpu_session.sh: stage '$1' is not known; accepted: $STAGES" >&2; exit 2 ;;
  esac
done
[ ${#stages[@]} -gt 0 ] || usage
budget="${HWBENCH_CALL_BUDGET:-560}"
case "$budget" in
  ''|*[!0-9]*|0*) echo "gpu_session.sh: HWBENCH_CALL_BUDGET '$budget' is not accepted; give whole seconds, 1 or more, no leading 0" >&2; exit 2 ;;
esac
step_min="${HWBENCH_STEP_MIN:-30}"  # a step with less of the budget left is not started
case "$step_min" in
  ''|*[!0-9]*|0*) echo "gpu_session.sh: HWBENCH_STEP_MIN '$step_min' is not accepted; give whole seconds, 1 or more, no leading 0" >&2; exit 2 ;;
esac
repeats="${HWBENCH_RUN_REPEATS:-2}"  # the run stage's side-by-side repeats
case "$repeats" in
  ''|*[!0-9]*|0*) echo "gpu_session.sh: HWBENCH_RUN_REPEATS '$repeats' is not accepted; give a whole number, 1 or more, no leading 0" >&2; exit 2 ;;
esac
# Everything checked before anything is made: a refused call leaves nothing behind.
read -r -a earlier <<< "${HWBENCH_EARLIER:-}"  # earlier loans' result folders, for the report
for i in "${!earlier[@]}"; do
  [ -d "${earlier[$i]}" ] || { echo "gpu_session.sh: HWBENCH_EARLIER names '${earlier[$i]}', which is not a folder; give result folders of earlier loans" >&2; exit 2; }
  earlier[$i]="$(cd "${earlier[$i]}" && pwd)"
done
if [ -n "$dest" ]; then
  mkdir -p "$dest" 2>/dev/null && [ -w "$dest" ] || { echo "gpu_session.sh: --dest '$dest' cannot be made or written; give a writable folder" >&2; exit 2; }
  dest="$(cd "$dest" && pwd)"
fi
session="${HWBENCH_SESSION_DIR:-$here/gpu-session}"
mkdir -p "$session" 2>/dev/null || { echo "gpu_session.sh: HWBENCH_SESSION_DIR '$session' cannot be made; give a writable folder" >&2; exit 2; }
session="$(cd "$session" && pwd)"
device="${HWBENCH_DEVICE:-cuda}"
model="${HWBENCH_MODEL:-345m}"
precision="${HWBENCH_PRECISION:-bf16}"
suite="${HWBENCH_SUITE:-published-1dev}"
fast_suite="${HWBENCH_FAST_SUITE:-fast}"
batch_suite="${HWBENCH_BATCH_SUITE:-speed-1.3b}"
fp8_suite="${HWBENCH_FP8_SUITE:-fp8}"
read -r -a run_args <<< "${HWBENCH_RUN_ARGS:-}"  # extra options for the run stage (both sides)
py="${HWBENCH_PYTHON:-python3}"  # the Python that has torch (the device image's python3)
wheels="${HWBENCH_WHEELS:-$here/gpu-wheels}"
site="${HWBENCH_SITE:-$here/gpu-site}"
export PYTHONPATH="$here:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# every run of the session reads the session's store, and so does the calibration below: its
# last line then names the store the runs really read
export HWBENCH_CALIBRATION="$session/calibration.json"
log="$session/session.log"
status=0
cd "$here"

say() { echo "$*" | tee -a "$log"; }

publish() {  # copy what a caller needs into DEST: at most 7 files, no folders
  [ -n "$dest" ] || return 0
  "$py" benchmarks/session_summary.py "$session" --out "$session/summary.md" > /dev/null 2>>"$log" || true
  tar -czf "$dest/results.tar.gz.part" -C "$session" --exclude='*.tar.gz*' . 2>>"$log" \
    && mv -f "$dest/results.tar.gz.part" "$dest/results.tar.gz" || { say "== publish: tar failed"; status=1; }
  local file
  for file in session.log summary.md system.json report.md report.html; do
    [ -f "$session/$file" ] && cp -f "$session/$file" "$dest/$file"
  done
  [ -f "$session/side-by-side/side_by_side.json" ] && cp -f "$session/side-by-side/side_by_side.json" "$dest/"
  return 0
}

step() {  # step NAME COMMAND...: run within the call's budget, log, remember a failure, publish, go on
  local name="$1"; shift
  local left=$((budget - SECONDS))
  if [ "$left" -lt "$step_min" ]; then
    say "== $name: not started, ${left} s left of the call's ${budget} s; run its stage again in the next call"
    status=1
    return
  fi
  say "== $name: $*"
  local started=$SECONDS
  timeout --signal=TERM --kill-after=20 "$((left - 5))" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 124 ]; then
    say "== $name: stopped at the call's budget after $((SECONDS - started)) s; run its stage again to go on"
  else
    say "== $name: exit $rc after $((SECONDS - started)) s"
  fi
  [ "$rc" -eq 0 ] || status=1
  publish
}

ok_results() {  # the result files with status ok in a folder, one a line
  "$py" - "$1" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        if json.loads(path.read_text()).get("status") == "ok":
            print(path)
    except (OSError, ValueError, AttributeError):
        pass
EOF
}

hw=("$py" -m hwbench)  # an array, not a function: `timeout` runs programs only

install_wheels() {  # gpu-wheels/ installed offline into gpu-site/, unless every module in it imports already
  if ! compgen -G "$wheels/*.whl" > /dev/null; then
    say "== wheels: none in $wheels (benchmarks/gpu_wheels.sh makes them on a machine with a registry; carry gpu-wheels)"
    return
  fi
  local missing
  missing="$("$py" - "$wheels" <<'EOF'
import importlib, pathlib, sys, zipfile
modules = set()
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            top = name.split("/")[0]
            top = top[:-3] if top.endswith(".py") else top
            if top.isidentifier():
                modules.add(top)
failed = []
for module in sorted(modules):
    try:
        importlib.import_module(module)
    except Exception as error:
        failed.append(f"{module} ({type(error).__name__}: {error})")
print("; ".join(failed))
EOF
)"
  if [ -z "$missing" ]; then
    say "== wheels: every module of $wheels imports already (from $site or the image)"
    return
  fi
  say "== wheels: not importable: $missing"
  step wheels "$py" -m pip install --no-index --find-links "$wheels" --no-deps --upgrade --target "$site" "$wheels"/*.whl
}

stage_probe() {
  step devices "${hw[@]}" devices
  if [ -s "$session/calibration.json" ]; then  # measured once per session: a second call keeps it
    say "== calibrate: kept $session/calibration.json"
  elif [ "$device" = cpu ]; then  # the mechanics on a CPU: small sizes, a few seconds; a CI runner is
    # rarely quiet, so a noisy rate is stored marked unreliable (--force) rather than stopping the rehearsal
    step calibrate "${hw[@]}" calibrate --device cpu --sizes 256,512 --copy-size 64MiB --repeats 5 \
      --min-time 0.2 --device-warmup 0.2 --force --store "$session/calibration.json"
  else
    step calibrate "${hw[@]}" calibrate --device "$device" --store "$session/calibration.json"
  fi
  local kept
  kept="$(ok_results "$session/probe" | head -n 1)"
  if [ -n "$kept" ]; then  # a failed probe is tried again, not kept
    say "== probe run: kept $kept"
  else
    step probe-run "${hw[@]}" run --quiet --device "$device" --model tiny --steps 3 --warmup 1 --eval-iters 0 \
      --data synthetic --out "$session/probe"
  fi
  local first
  first="$(ok_results "$session/probe" | head -n 1)"
  [ -n "$first" ] && step system "${hw[@]}" system "$first" --out "$session/system.json"
  if [ "$device" = cuda ] && [ ! -s "$session/cuda_context.json" ]; then  # seconds: what the CPU cannot tell
    step cuda-context "$py" benchmarks/cuda_context_probe.py --out "$session/cuda_context.json"
  fi
}

stage_run() {
  if [ -f "$session/side-by-side/side_by_side.json" ] && "$py" - "$session/side-by-side/side_by_side.json" "$repeats" <<'EOF'
import json, sys
document = json.load(open(sys.argv[1]))
whole = document.get("repeats_done") == int(sys.argv[2]) == document["options"].get("repeats")
sys.exit(0 if whole and all("error" not in side for r in document["repeats"] for side in r["sides"].values()) else 1)
EOF
  then
    say "== run: kept $session/side-by-side (every side of its $repeats repeats ran); remove it to measure again"
    return
  fi
  # --resume: the repeats an earlier call on this machine finished are kept; only the rest run
  step side-by-side "$py" benchmarks/side_by_side.py --device "$device" --model "$model" --precision "$precision" \
    --repeats "$repeats" "${run_args[@]}" --timeout 240 --resume --out "$session/side-by-side"
}

stage_sweep() { step sweep "${hw[@]}" sweep "$suite" --device "$device" --out "$session/sweep"; }

stage_fast() { step fast "${hw[@]}" sweep "$fast_suite" --device "$device" --out "$session/fast"; }

stage_batch() { step batch "${hw[@]}" sweep "$batch_suite" --device "$device" --out "$session/batch"; }

stage_fp8() { step fp8 "${hw[@]}" sweep "$fp8_suite" --device "$device" --out "$session/fp8"; }

stage_report() {
  local inputs=()
  local folder
  for folder in "$session"/side-by-side/r*/hwbench "$session/fast" "$session/sweep" "$session/batch" "$session/fp8" \
      "${earlier[@]}"; do
    [ -d "$folder" ] && inputs+=("$folder")  # an unmatched glob stays as written: not a folder
  done
  if [ ${#inputs[@]} -eq 0 ]; then
    say "== report: no results yet (run the fast, run, sweep, batch or fp8 stage first)"
    status=1
    return
  fi
  step report-md "${hw[@]}" report "${inputs[@]}" --against "$here/results/published" --format md --out "$session/report.md"
  step report-html "${hw[@]}" report "${inputs[@]}" --against "$here/results/published" --format html \
    --out "$session/report.html"
}

check_requirements() {  # every requirement of pyproject.toml met? said first, before minutes are spent
  local unmet
  unmet="$("$py" - "$here/pyproject.toml" <<'EOF'
import sys, tomllib
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement
unmet = []
for text in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    requirement = Requirement(text)
    try:
        installed = version(requirement.name)
    except PackageNotFoundError:
        unmet.append(f"{requirement} (not installed)")
        continue
    if not requirement.specifier.contains(installed, prereleases=True):
        unmet.append(f"{requirement} (installed: {installed})")
print("; ".join(unmet))
EOF
)" || unmet="the check itself failed (see above)"
  if [ -n "$unmet" ]; then
    say "== requirements: NOT MET: $unmet; the commands that import them will fail (benchmarks/gpu_wheels.sh --all carries every dependency)"
    status=1
  else
    say "== requirements: every dependency in pyproject.toml is met"
  fi
}

install_wheels
check_requirements
for stage in "${stages[@]}"; do
  say "==== stage $stage ($(date -u +%H:%M:%S) UTC, ${SECONDS} s into the call, device $device)"
  "stage_$stage"
done
publish
say "==== done: exit $status; session in $session${dest:+, files in $dest}"
"$py" benchmarks/session_summary.py "$session" 2>>"$log" || status=1  # the short table, last
exit "$status"
