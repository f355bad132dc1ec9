#!/usr/bin/env bash
# A two-node Slurm inside this one machine for hwbench's multi-node tests (docs/slurm.md):
#
#   tests/slurm/start_two_node_slurm.sh DIR      # start; prints `export SLURM_CONF=DIR/slurm.conf`
#   tests/slurm/start_two_node_slurm.sh --stop DIR
#
# Each node daemon (slurmd) runs in a network namespace of its own, with its own host
# name (a UTS namespace: hwb-node1, hwb-node2) and its own address on a Linux bridge
# (a veth pair each); the controller (slurmctld, host name hwb-ctl) holds the bridge's
# address, so it reaches both nodes and they reach it and each other. Each daemon's
# mount namespace sees DIR/hosts as /etc/hosts, so the three names resolve to those
# addresses inside the jobs too, as they would on a cluster. Nothing reaches outside
# this machine. One munged (its socket is a file, which every namespace sees) serves
# all three. Everything else lives in DIR, as for tests/slurm/start_local_slurm.sh,
# whose choices this follows (no cgroups, no accounting database, final states in
# DIR/jobcomp.txt) and whose --stop ends the controller and munged.
#
# Exit status 3, with the reason on stderr, where this machine cannot host it: a tool
# missing (slurm-wlm, munge, iproute2, util-linux, python3), not root, no permission to
# create network namespaces, bridges, veth pairs or mounts, or a firewall between the nodes.
set -euo pipefail
here=$(dirname "$(realpath "$0")")
NODES=(hwb-node1 hwb-node2)

stop() {
    local dir=$1
    if [[ -s $dir/network.env ]]; then
        # shellcheck disable=SC1091
        source "$dir/network.env"
        for node in "${NODES[@]}"; do
            local pidfile="$dir/slurmd-$node.pid"
            if [[ -s $pidfile ]]; then
                local pid
                pid=$(cat "$pidfile")
                kill "$pid" 2>/dev/null || true
                for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
                rm -f "$pidfile"
            fi
            local namespace="${NETNS_PREFIX}-$node"
            # whatever is left in the namespace (a job step slurmd left behind) goes with it
            for pid in $(ip netns pids "$namespace" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
            ip netns del "$namespace" 2>/dev/null || true  # takes the veth pair with it
            ip link del "${VETH_PREFIX}${node##*node}" 2>/dev/null || true
        done
        ip link del "$BRIDGE" 2>/dev/null || true
        rm -f "$dir/network.env"
    fi
    "$here/start_local_slurm.sh" --stop "$dir"  # slurmctld and munged, by their pid files
}

cannot() { echo "the two-node Slurm cannot run here: $*" >&2; exit 3; }

if [[ ${1:-} == --stop ]]; then
    stop "$(realpath -m "${2:?usage: $0 --stop DIR}")"
    exit 0
fi
dir=$(realpath -m "${1:?usage: $0 DIR}")
for tool in slurmctld slurmd munged sinfo ip unshare nsenter mount python3; do
    command -v "$tool" >/dev/null || cannot "$tool not found: install slurm-wlm, munge, iproute2, util-linux and python3"
done
[[ $(id -u) == 0 ]] || cannot "it needs root (network namespaces, bridges; slurmd runs jobs as their user)"
# Everything the start needs, tried in a throwaway namespace that leaves nothing behind.
probe=$(unshare --net --uts --mount sh -c 'ip link add hwbprobe type bridge && ip link add hwbprobe0 type veth \
    peer name hwbprobe1 && mount --bind /etc/hosts /etc/hosts && hostname hwb-probe' 2>&1) \
    || cannot "no permission for namespaces, bridges, veth pairs or mounts: $probe"
probe_ns="hwb-probe-$$"
probe=$(ip netns add "$probe_ns" 2>&1) || cannot "ip netns add failed: $probe"
ip netns del "$probe_ns"

# A /24 that no interface of this machine uses; its third byte names the bridge, the
# veths and the namespaces, so two of these can run side by side.
used=$(ip -4 -o addr show | awk '{print $4}')
subnet=""
for _ in $(seq 50); do
    candidate=$(( RANDOM % 250 + 1 ))
    grep -q "^10\.211\.$candidate\." <<<"$used" || ip link show "hwb${candidate}br" >/dev/null 2>&1 \
        || { subnet=$candidate; break; }
done
[[ -n $subnet ]] || { echo "no free 10.211.N.0/24 subnet for the bridge" >&2; exit 1; }
mkdir -p "$dir"/{state,munge}
chmod 700 "$dir/munge"
cat >"$dir/network.env" <<ENV
BRIDGE=hwb${subnet}br
VETH_PREFIX=hwb${subnet}v
NETNS_PREFIX=hwb${subnet}
ENV
source "$dir/network.env"
trap 'status=$?; if [[ $status != 0 ]]; then echo "the two-node Slurm did not come up; logs in $dir" >&2; stop "$dir"; fi' EXIT

address() { echo "10.211.$subnet.$1"; }  # .1 the controller (the bridge), .2 and .3 the nodes
ip link add "$BRIDGE" type bridge
ip addr add "$(address 1)/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
{
    echo "127.0.0.1 localhost"
    echo "$(address 1) hwb-ctl"
} >"$dir/hosts"
for index in "${!NODES[@]}"; do
    node=${NODES[$index]}
    namespace="${NETNS_PREFIX}-$node"
    veth="${VETH_PREFIX}$((index + 1))"
    ip netns add "$namespace"
    ip link add "$veth" type veth peer name eth0 netns "$namespace"
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$namespace" addr add "$(address $((index + 2)))/24" dev eth0
    ip -n "$namespace" link set eth0 up
    ip -n "$namespace" link set lo up
    echo "$(address $((index + 2))) $node" >>"$dir/hosts"
done

# Node to node over the bridge, before any daemon: a host whose firewall filters bridged
# traffic (br_netfilter with a FORWARD policy of DROP, as Docker sets) would leave a
# rendezvous across the nodes waiting until its timeout.
in_node() { local netns="${NETNS_PREFIX}-$1"; shift; nsenter --net="/run/netns/$netns" "$@"; }
in_node "${NODES[0]}" python3 -c 'import socket; s = socket.create_server(("0.0.0.0", 6819)); s.settimeout(30); s.accept()' \
    2>/dev/null &
listener=$!
if ! in_node "${NODES[1]}" python3 -c 'import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        socket.create_connection((sys.argv[1], 6819), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.1)' "$(address 2)"; then
    kill "$listener" 2>/dev/null || true
    cannot "${NODES[1]} cannot reach ${NODES[0]} over the bridge (a firewall filtering bridged traffic?)"
fi
wait "$listener" || true

dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("0.0.0.0",0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port)
slurmd_port=6818  # each slurmd has a network namespace of its own: nothing else listens there
cpus=$(nproc --all)
memory_mib=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 / ${#NODES[@]} ))
user=$(id -un)
node_lines=$(for index in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$index]} NodeAddr=$(address $((index + 2))) CPUs=$cpus RealMemory=$memory_mib State=UNKNOWN"
done)

cat >"$dir/slurm.conf" <<CONF
# written by tests/slurm/start_two_node_slurm.sh: two nodes in network namespaces, one machine
ClusterName=hwbench-two
SlurmctldHost=hwb-ctl($(address 1))
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
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
$node_lines
PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF

export SLURM_CONF=$dir/slurm.conf
# Each daemon: its host name (UTS namespace) and DIR/hosts as /etc/hosts (a private mount
# namespace). nsenter, not `ip netns exec`: that would mount a sysfs of the namespace over
# /sys and hide /sys/fs/cgroup, which slurmd reads. Every step execs (the background
# subshell, nsenter, unshare, sh), so $! is the daemon's pid.
as_host() {  # as_host NETNS NAME COMMAND...: COMMAND in network namespace NETNS ("": this one) as host NAME
    local netns=$1 name=$2
    shift 2
    exec ${netns:+nsenter --net=/run/netns/"$netns"} unshare --uts --mount --propagation private \
        sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' sh "$dir/hosts" "$name" "$@"
}
as_host "" hwb-ctl slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
echo $! >"$dir/slurmctld.pid"
for node in "${NODES[@]}"; do
    mkdir -p "$dir/spool-$node"
    as_host "${NETNS_PREFIX}-$node" "$node" slurmd -D -N "$node" -f "$SLURM_CONF" >"$dir/slurmd-$node.out" 2>&1 &
    echo $! >"$dir/slurmd-$node.pid"
done

for _ in $(seq 300); do
    states=$(sinfo -h -N -o '%T' 2>/dev/null | sort -u | tr '\n' ' ' || true)
    [[ $states == "idle " && $(sinfo -h -N -o '%N' 2>/dev/null | sort -u | wc -l) == "${#NODES[@]}" ]] \
        && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
    sleep 0.1
done
echo "the two-node Slurm did not come up (node states: ${states:-none})" >&2
tail -n 5 "$dir"/slurmctld.log "$dir"/slurmd-*.log >&2 || true
exit 1
