#!/usr/bin/env bash
# A single-node Slurm on loopback for hwbench's tests (docs/slurm.md):
#
#   tests/slurm/start_local_slurm.sh DIR      # start; prints `export SLURM_CONF=DIR/slurm.conf`
#   tests/slurm/start_local_slurm.sh --stop DIR
#
# Everything lives in DIR: slurm.conf, a munge key and socket of its own (so a
# munged the machine already runs is left alone), state, spool, logs, pid files.
# It needs the Debian/Ubuntu packages slurm-wlm (slurmctld, slurmd, the client
# tools) and munge, and root (slurmd starts jobs as their user). No cgroups:
# proctrack/linuxproc, task/none, so it also runs in a container.
set -euo pipefail

stop() {
    local dir=$1
    for name in slurmd slurmctld munged; do
        local pidfile="$dir/$name.pid"
        [[ -s $pidfile ]] || continue
        local pid
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
}

if [[ ${1:-} == --stop ]]; then
    stop "${2:?usage: $0 --stop DIR}"
    exit 0
fi
dir=$(realpath -m "${1:?usage: $0 DIR}")
for tool in slurmctld slurmd munged sinfo; do
    command -v "$tool" >/dev/null || { echo "$tool not found: install the slurm-wlm and munge packages" >&2; exit 3; }
done
[[ $(id -u) == 0 ]] || { echo "the local Slurm needs root (slurmd runs jobs as their user)" >&2; exit 3; }
mkdir -p "$dir"/{state,spool,munge}
chmod 700 "$dir/munge"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port)
slurmd_port=$(free_port)
cpus=$(nproc --all)
memory_mib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
user=$(id -un)

dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed"

cat > "$dir/slurm.conf" <<CONF
# written by tests/slurm/start_local_slurm.sh: one node on loopback
ClusterName=hwbench-local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# no slurmdbd, so no sacct: final states are kept by scontrol for MinJobAge seconds
# and written to the job completion file
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
MinJobAge=3600
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mib State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF

export SLURM_CONF=$dir/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
echo $! >"$dir/slurmctld.pid"
slurmd -D -N localhost -f "$SLURM_CONF" >"$dir/slurmd.out" 2>&1 &
echo $! >"$dir/slurmd.pid"

for _ in $(seq 300); do
    state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
    [[ $state == idle ]] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
    sleep 0.1
done
echo "the local Slurm did not come up (node state: ${state:-none}); logs in $dir" >&2
tail -n 5 "$dir"/slurmctld.log "$dir"/slurmd.log >&2 || true
stop "$dir"
exit 1
