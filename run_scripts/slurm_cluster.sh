#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests and trying the batch scripts (root only).
#
#   eval "$(bash run_scripts/slurm_cluster.sh start)"   # starts it; exports SLURM_CONF
#   sbatch run_scripts/slurm/train.sbatch configs/tiny.yaml
#   bash run_scripts/slurm_cluster.sh status            # sinfo; exit 1 when it is not up
#   bash run_scripts/slurm_cluster.sh stop
#
# Needs Debian's slurm-wlm (22.05) and munge (run_scripts/install.sh installs them as root).
# Everything SLURM writes (slurm.conf, state, spool, logs, pid files) is under one work directory,
# HVDTRACK_SLURM_DIR (default /tmp/hvdtrack-slurm). munged is started when not running, with a
# key created only if /etc/munge/munge.key is missing (an existing key is never replaced).
# HVDTRACK_SLURMCTLD_PORT and HVDTRACK_SLURMD_PORT (default 6817, 6818) let a second cluster, e.g.
# the tests', run beside one already up. `start` prints one line on stdout, `export SLURM_CONF=...`; progress goes to stderr.
# The settings that matter for the tests: AuthInfo=cred_expire=20 (a requeued job restarts after
# ~25 s rather than ~2 min), JobRequeue=1, SchedulerParameters=sched_interval=5, KillWait=10,
# OverTimeLimit=1, no accounting.
set -euo pipefail

dir="${HVDTRACK_SLURM_DIR:-/tmp/hvdtrack-slurm}"
conf="$dir/slurm.conf"
wait_s="${HVDTRACK_SLURM_WAIT:-30}"

say() { printf '[slurm-cluster] %s\n' "$*" >&2; }
die() {
    printf '[slurm-cluster] ERROR: %s\n' "$1" >&2
    [ $# -gt 1 ] && printf '[slurm-cluster] what to do: %s\n' "$2" >&2
    exit 1
}
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# Runs "$@" until it succeeds, at most $wait_s seconds; returns 1 then.
poll() {
    local deadline=$((SECONDS + wait_s))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}
node_idle() { SLURM_CONF="$conf" sinfo -h -o %T | grep -qx 'idle'; }
munge_works() { munge -n | unmunge; }
no_jobs() { [ -z "$(SLURM_CONF="$conf" squeue -h -o %i 2>/dev/null)" ]; }

start_munge() {
    if munge_works >/dev/null 2>&1; then
        return
    fi
    if [ ! -f /etc/munge/munge.key ]; then
        say "creating /etc/munge/munge.key"
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged
    touch "$dir/munged.ours" # stop ends only a munged that start started
    poll munge_works || die "munged does not answer after ${wait_s} s" \
        "look at /var/log/munge/munged.log"
}

write_conf() {
    local host node name
    host="$(hostname -s)"
    node="$(slurmd -C | head -n 1)" # NodeName=... CPUs=... RealMemory=...
    name="${node%% *}"
    name="${name#NodeName=}"
    mkdir -p "$dir/state" "$dir/spool"
    cat >"$conf" <<EOF
# Written by run_scripts/slurm_cluster.sh: a one-node test cluster, no accounting.
ClusterName=hvdtrack
SlurmctldHost=$host
SlurmctldPort=${HVDTRACK_SLURMCTLD_PORT:-6817}
SlurmdPort=${HVDTRACK_SLURMD_PORT:-6818}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=20
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=5
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
# TERM -> KILL after 10 s (default 30): time enough for the ranks to checkpoint on scancel, and a
# rank whose peer died (it takes srun's TERM as a request to checkpoint and may wait in a
# collective that never completes) is ended sooner.
KillWait=10
# A job over its time limit is ended 1 minute later (OverTimeLimit is in minutes): time enough,
# on a loaded machine, for ranks signalled just before a --time=1 limit to checkpoint and the
# job to requeue itself. SLURM checks limits (and sends --signal) every 30 s.
OverTimeLimit=1
$node State=UNKNOWN
PartitionName=debug Nodes=$name Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
    [ "$(id -u)" = 0 ] || die "the test cluster runs as root (SlurmUser=root, munged via runuser)" \
        "run as root, or use a real SLURM system"
    for tool in slurmctld slurmd sinfo munged mungekey; do
        command -v "$tool" >/dev/null || die "no $tool on PATH" \
            "apt-get install slurm-wlm munge (run_scripts/install.sh does it as root)"
    done
    mkdir -p "$dir"
    if alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid" && node_idle; then
        say "already running ($conf)"
        echo "export SLURM_CONF=$conf"
        return
    fi
    start_munge
    write_conf
    # -c: start clean, no jobs left over from an earlier cluster in this directory.
    alive "$dir/slurmctld.pid" || slurmctld -c -f "$conf" || die "slurmctld did not start" \
        "look at $dir/slurmctld.log"
    alive "$dir/slurmd.pid" || slurmd -f "$conf" || die "slurmd did not start" \
        "look at $dir/slurmd.log"
    if ! poll node_idle; then
        SLURM_CONF="$conf" sinfo >&2 || true
        tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
        die "the node is not idle after ${wait_s} s" "read the logs above ($dir)"
    fi
    say "up in $SECONDS s: partition debug, node $(hostname -s), logs in $dir"
    echo "export SLURM_CONF=$conf"
}

stop() {
    if [ -f "$conf" ] && alive "$dir/slurmctld.pid"; then
        # Jobs first, so that no slurmstepd is left behind by a slurmd that is gone.
        local jobs
        jobs="$(SLURM_CONF="$conf" squeue -h -o %i 2>/dev/null || true)"
        if [ -n "$jobs" ]; then
            say "cancelling jobs: ${jobs//$'\n'/ }"
            # shellcheck disable=SC2086
            SLURM_CONF="$conf" scancel $jobs 2>/dev/null || true
            poll no_jobs ||
                say "jobs still there after ${wait_s} s: shutting down anyway"
        fi
        SLURM_CONF="$conf" scontrol shutdown >/dev/null 2>&1 || true
    fi
    for daemon in slurmctld slurmd; do
        local pidfile="$dir/$daemon.pid"
        if alive "$pidfile"; then
            local pid deadline=$((SECONDS + 10))
            pid="$(cat "$pidfile")"
            while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
            kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
            deadline=$((SECONDS + 5))
            while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        fi
        rm -f "$pidfile"
    done
    if [ -f "$dir/munged.ours" ]; then
        if alive /run/munge/munged.pid; then
            kill -TERM "$(cat /run/munge/munged.pid)" 2>/dev/null || true
        fi
        rm -f "$dir/munged.ours"
    fi
    say "stopped"
}

status() {
    if [ -f "$conf" ] && alive "$dir/slurmctld.pid" && alive "$dir/slurmd.pid"; then
        SLURM_CONF="$conf" sinfo
        echo "export SLURM_CONF=$conf"
    else
        say "not running ($dir)"
        return 1
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *)
        echo "usage: $0 start|stop|status   (work directory: HVDTRACK_SLURM_DIR, default /tmp/hvdtrack-slurm)" >&2
        exit 2
        ;;
esac
