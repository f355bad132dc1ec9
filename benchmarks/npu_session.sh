#!/usr/bin/env bash
# The checks a first session on an Ascend host owes docs/npu.md, in one command (the NPU
# counterpart of benchmarks/gpu_session.sh, which then measures the published workloads:
# HWBENCH_DEVICE=npu benchmarks/gpu_session.sh all). What has only been checked against the
# wheel, the stand-in and published npu-smi outputs so far, checked on the real thing:
#   1. the host: raw `npu-smi info` and `npu-smi info -m` (the chip mapping: is the logical id
#      the Phy-ID / Device column hwbench reads telemetry by?), torch, torch_npu and CANN versions;
#   2. the stand-in's fidelity check against the installed torch_npu (tests/fakes/check_wheel_fidelity.py);
#   3. hwbench's npu-smi parser on this host's output: one row per chip, by device id;
#   4. without CANN's environment (a shell that did not source set_env.sh): --device npu must be
#      one line naming set_env.sh with exit 2, and --device cpu must still work;
#   5. `hwbench devices`, then one run on one NPU (345m, bf16; fp16 on a first-generation 910);
#   6. with two or more NPUs: a 2-rank run over HCCL (per-rank telemetry by device id), and the
#      same with --engine deepspeed --zero 2 when deepspeed is installed (records deepspeed_npu's
#      decision).
# Everything lands in OUTDIR (default ./npu-session): npu-smi-info.txt, npu-smi-info-m.txt,
# versions.txt, fidelity.txt, parsed.json, results/, session.log. Run it from a shell where
# set_env.sh is sourced:
#
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh && benchmarks/npu_session.sh [OUTDIR]
#   HWBENCH_PRECISION=fp16 benchmarks/npu_session.sh     # Ascend 910 (first generation): no bf16
set -uo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-npu-session}" && cd "${1:-npu-session}" && pwd)" || { echo "cannot use ${1:-npu-session}" >&2; exit 2; }
model="${HWBENCH_MODEL:-345m}"
precision="${HWBENCH_PRECISION:-bf16}"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
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
expect_exit() {  # expect_exit NAME CODE COMMAND...: like step, but the command must exit CODE
  local name="$1" want="$2"; shift 2
  echo "== $name (expects exit $want): $*" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc" | tee -a "$log"
  [ "$rc" -eq "$want" ] || status=1
}
# A shell without CANN's environment: HOME, and PATH and PYTHONPATH without the Ascend
# folders set_env.sh adds (no LD_LIBRARY_PATH, no ASCEND_*).
without_ascend() { echo "$1" | tr ':' '\n' | grep -v -i ascend | paste -sd: -; }
without_cann() {
  env -i HOME="$HOME" PATH="$(without_ascend "$PATH")" PYTHONPATH="$(without_ascend "$PYTHONPATH")" "$@"
}

cd "$here"
: > "$log"
results="$out/results"
mkdir -p "$results"

# 1. The host.
step npu-smi sh -c "npu-smi info > '$out/npu-smi-info.txt'; cat '$out/npu-smi-info.txt'"
step npu-smi-m sh -c "npu-smi info -m > '$out/npu-smi-info-m.txt'; cat '$out/npu-smi-info-m.txt'"
step versions sh -c "{ python3 -c 'import torch, torch_npu; print(\"torch\", torch.__version__, \"torch_npu\", torch_npu.__version__, \"devices\", torch.npu.device_count(), [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())])'; \
  cat \"\${ASCEND_TOOLKIT_HOME:-/usr/local/Ascend/ascend-toolkit/latest}/version.cfg\" 2>/dev/null; \
  cat /usr/local/Ascend/driver/version.info 2>/dev/null; } > '$out/versions.txt'; cat '$out/versions.txt'"

# 2. The stand-in against the installed wheel (its site-packages folder, found without importing it).
site="$(TORCH_DEVICE_BACKEND_AUTOLOAD=0 python3 -c 'import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec("torch_npu").origin)))')"
step fidelity sh -c "python3 tests/fakes/check_wheel_fidelity.py '$site' > '$out/fidelity.txt'; rc=\$?; cat '$out/fidelity.txt'; exit \$rc"

# 3. The parser on this host's npu-smi output.
step parse python3 -c "import json, sys; from hwbench.device.npu_smi import parse_npu_smi_rows; \
rows = parse_npu_smi_rows(open('$out/npu-smi-info.txt').read()); json.dump(rows, open('$out/parsed.json', 'w'), indent=1); \
print(len(rows), 'chips:', [(r['npu'], r.get('chip'), r.get('device_id'), r['power_w'], r.get('hbm_used_mb', r.get('memory_used_mb'))) for r in rows])"

# 4. Without CANN's environment.
expect_exit no-cann-npu 2 without_cann python3 -m hwbench run --device npu --model tiny --out "$results/no-cann"
expect_exit no-cann-cpu 0 without_cann python3 -m hwbench run --device cpu --model tiny --steps 2 --warmup 1 \
  --eval-iters 0 --quiet --out "$results/no-cann-cpu"

# 5. The device, then one NPU.
step devices hw devices
step run hw run --device npu --model "$model" --precision "$precision" --data synthetic --eval-iters 0 \
  --out "$results/run"

# 6. Two ranks, native then DeepSpeed.
count="$(python3 -c 'import torch, torch_npu; print(torch.npu.device_count())' 2>/dev/null || echo 0)"
if [ "${count:-0}" -ge 2 ]; then
  step run-2ranks hw run --device npu --model "$model" --precision "$precision" --data synthetic --eval-iters 0 \
    --nproc-per-node 2 --out "$results/run-2ranks"
  if python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("deepspeed") is None)'; then
    step run-deepspeed hw run --device npu --model "$model" --precision "$precision" --data synthetic \
      --eval-iters 0 --nproc-per-node 2 --engine deepspeed --zero 2 --out "$results/run-deepspeed"
  fi
fi
echo "== done: exit $status; files in $out" | tee -a "$log"
exit "$status"
