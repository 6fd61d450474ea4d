#!/usr/bin/env bash
# A one-node SLURM on this machine, to try `hydra/launcher=slurm` sweeps without a cluster
# (docs/cluster.md) and for CI's SLURM lane. Needs root and Debian's packages:
#
#   sudo bash scripts/slurm_local.sh start   # installs slurm-wlm and munge if missing
#   sinfo                                    # one node, "idle"
#   sudo bash scripts/slurm_local.sh stop
#
# It writes /etc/slurm/slurm.conf (refusing to replace one it did not write), runs munged,
# slurmctld and slurmd as root with their state under /var/lib/slurm-local, and declares
# the node with the CPUs and memory this machine has. Not for a shared machine: every job
# runs as the user who submits it, on this one node, without cgroups.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
STATE=/var/lib/slurm-local
MARK="# written by rllib-runner's scripts/slurm_local.sh"

die() { echo "slurm_local.sh: $*" >&2; exit 2; }

install() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    command -v apt-get >/dev/null || die "needs Debian's slurm-wlm and munge (apt-get not found)"
    # apt's and debconf's chatter to a log (their stderr, too): it is shown only on failure.
    local log
    log=$(mktemp)
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; }
    } >"$log" 2>&1 || die "installing slurm-wlm and munge failed: $(tail -n 1 "$log") (all of it in $log)"
    rm -f "$log"
}

write_conf() {
    if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
        die "$CONF exists and was not written by this script: this machine has a SLURM of its own"
    fi
    local host cpus mem_mb
    host=$(hostname -s)
    cpus=$(nproc)
    # What slurmd will find, less a margin, so the node is not drained for too little memory.
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
    mkdir -p "$STATE/ctld" "$STATE/d" /etc/slurm
    cat >"$CONF" <<EOF
$MARK
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
# A requeued job may start again at once (the default holds it back 2 minutes).
MinJobAge=60
KillWait=30
# A job that asks for no memory gets its CPUs' share, so jobs share the node.
DefMemPerCPU=$(( mem_mb / cpus ))
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start() {
    [[ $(id -u) == 0 ]] || die "start needs root (it installs packages and starts daemons)"
    install
    write_conf
    mkdir -p /run/munge && chown munge:munge /run/munge
    pgrep -x munged >/dev/null || runuser -u munge -- munged
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 60); do
        if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
            echo "SLURM is up: $(sinfo -h -o '%P %D node %c CPUs %m MB %t')"
            return
        fi
        sleep 1
    done
    die "the node did not come up idle in 60 s: see $STATE/slurmctld.log and $STATE/slurmd.log"
}

stop() {
    [[ $(id -u) == 0 ]] || die "stop needs root"
    local daemon
    for daemon in slurmd slurmctld munged; do
        pkill -x "$daemon" || true
        for _ in $(seq 60); do  # gone before a start that follows finds it running
            pgrep -x "$daemon" >/dev/null || break
            sleep 0.5
        done
    done
    echo "SLURM stopped (its state stays in $STATE)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) die "usage: slurm_local.sh start|stop" ;;
esac
