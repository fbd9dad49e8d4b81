#!/usr/bin/env bash
# Bring up / tear down a real single-node SLURM cluster on localhost.
#
#   bash slurm/local_cluster.sh up       # install (if needed), configure, start, wait until idle
#   bash slurm/local_cluster.sh status   # ours up (sinfo + squeue, exit 0) or down (exit 1), and
#                                        # whether another cluster answers srun here
#   bash slurm/local_cluster.sh env      # print the exports for `eval`: SLURM_CONF, and
#                                        # HPC_C10D_TEST_SLURM_CLUSTER (the tests may submit here)
#   bash slurm/local_cluster.sh down     # cancel this cluster's jobs, stop what is left of them
#                                        # (slurmstepd, srun, ranks), then exactly the daemons `up` started
#
# Meant for sandboxes and CI boxes with no systemd and no cgroup delegation,
# running as root. Everything (config, munge key + socket, spool dirs, logs,
# pid files) lives in one state dir; /etc/munge is not used. The only
# system-wide changes are the apt install and a /etc/slurm/slurm.conf symlink
# to our config (see `link_etc_conf`) so that plain `srun` works even without
# SLURM_CONF in the environment. The daemons use the standard ports 6817
# (slurmctld) and 6818 (slurmd) unless told otherwise; `up` first checks that
# no other process listens there, and names it if one does.
#
# Environment knobs:
#   HPC_C10D_SLURM_DIR   state dir            (default /tmp/hpc_c10d_slurm)
#   HPC_C10D_SLURM_CPUS  CPUs to advertise    (default 16; real cores may be fewer)
#   HPC_C10D_SLURM_WAIT  seconds to wait for the node to become idle (default 60)
#   HPC_C10D_SLURM_CTLD_PORT, HPC_C10D_SLURM_SLURMD_PORT
#                        the daemons' ports (default 6817, 6818), e.g. beside another cluster
set -euo pipefail
# shellcheck source=slurm/slurm_conf.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/slurm_conf.sh"

STATE_DIR="${HPC_C10D_SLURM_DIR:-/tmp/hpc_c10d_slurm}"
CPUS="${HPC_C10D_SLURM_CPUS:-16}"
WAIT_S="${HPC_C10D_SLURM_WAIT:-60}"
CTLD_PORT="${HPC_C10D_SLURM_CTLD_PORT:-6817}"
SLURMD_PORT="${HPC_C10D_SLURM_SLURMD_PORT:-6818}"
CLUSTER="hpc_c10d"
PARTITION="debug"
NODE="$(hostname -s)"

CONF="$STATE_DIR/slurm.conf"
MUNGE_DIR="$STATE_DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
MUNGE_KEY="$MUNGE_DIR/munge.key"

# Every slurm command and daemon we run reads this config; the caller's own
# commands may reach another cluster (status says so).
CALLER_SLURM_CONF="${SLURM_CONF:-}"
export SLURM_CONF="$CONF"

log() { echo "[local_cluster] $*" >&2; }

# ---------------------------------------------------------------- install --
# Commands we need (from Debian's slurm-wlm and munge packages).
REQUIRED_CMDS="munged munge unmunge slurmctld slurmd srun sbatch salloc scontrol scancel sinfo squeue"

install_packages() {
    local missing="" c
    for c in $REQUIRED_CMDS; do
        command -v "$c" >/dev/null 2>&1 || missing="$missing $c"
    done
    # srun --mpi=pmix (how Open MPI's processes join one world) loads libpmix.so, which only
    # Debian's libpmix-dev ships
    ldconfig -p 2>/dev/null | grep -q 'libpmix\.so ' || missing="$missing libpmix.so"
    [ -z "$missing" ] && return 0
    log "missing:$missing -> installing slurm-wlm + munge + libpmix-dev via apt"
    export DEBIAN_FRONTEND=noninteractive
    # Only refresh the package lists if apt cannot see the package at all.
    if ! apt-cache show slurmctld >/dev/null 2>&1; then
        apt-get update -q
    fi
    # Debian's postinst scripts would start the system munge/slurm services;
    # we want only our own daemons, so deny service starts during the install
    # with a temporary policy-rc.d (unless the box already has one).
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && made_policy=1
    fi
    # slurm-wlm = slurmctld + slurmd + slurm-client (+ basic plugins, munge).
    local rc=0
    apt-get install -y -q --no-install-recommends slurm-wlm munge libpmix-dev || rc=$?
    if [ "$rc" != 0 ]; then   # stale package lists? refresh once and retry
        rc=0
        apt-get update -q && apt-get install -y -q --no-install-recommends slurm-wlm munge libpmix-dev || rc=$?
    fi
    [ "$made_policy" = 1 ] && rm -f "$policy"
    [ "$rc" = 0 ] || { log "ERROR: apt-get install failed (rc=$rc)"; exit "$rc"; }
}

# ------------------------------------------------------------ pid helpers --
pidfile() { echo "$STATE_DIR/$1.pid"; }

# True if the pid recorded for daemon $1 is alive AND is still that program
# (guards against a stale pid file whose pid was reused by something else).
is_running() {
    local pf pid
    pf="$(pidfile "$1")"
    [ -s "$pf" ] || return 1
    pid="$(cat "$pf")"
    kill -0 "$pid" 2>/dev/null || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ]
}

all_running() { is_running munged && is_running slurmctld && is_running slurmd; }
any_running() { is_running munged || is_running slurmctld || is_running slurmd; }

# Start daemon $1 (args follow) in the foreground of a new session, in the
# background of this script; its pid is $! and goes to the pid file. setsid
# detaches it from our terminal / process group, so it outlives this shell.
start_daemon() {
    local name="$1"; shift
    if is_running "$name"; then
        log "$name already running (pid $(cat "$(pidfile "$name")"))"
        return 0
    fi
    log "starting $name"
    setsid "$@" </dev/null >>"$STATE_DIR/$name.out" 2>&1 &
    local pid=$!
    echo "$pid" >"$(pidfile "$name")"
    # Wait (max 5 s) until the forked shell has exec'd the daemon, so that
    # is_running (which checks /proc/PID/comm) is meaningful from now on.
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break   # died already: wait_for reports it
        is_running "$name" && break            # exec done
        sleep 0.1
    done
}

# ------------------------------------------------------------ config -------
write_config() {
    mkdir -p "$STATE_DIR" "$STATE_DIR/ctld" "$STATE_DIR/slurmd" "$MUNGE_DIR"
    chmod 0755 "$STATE_DIR"
    # munged wants its dirs not writable by others, but searchable (x) by all
    # so that non-root users' jobs can reach the socket.
    chmod 0711 "$MUNGE_DIR"

    # One munge key per state dir; munged wants it owned by us and mode 0400.
    if [ ! -s "$MUNGE_KEY" ]; then
        log "creating munge key $MUNGE_KEY"
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    fi
    chmod 0400 "$MUNGE_KEY"

    # Real memory in MiB, rounded down, minus a little slack.
    local mem_mb
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))

    {
        cat <<EOF
# Generated by slurm/local_cluster.sh -- single-node localhost cluster.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
EOF
        slurm_conf_shared "$STATE_DIR/slurmd" "$STATE_DIR/slurmd.daemon.pid" "$STATE_DIR/slurmd.log"
        cat <<EOF
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    } >"$CONF.tmp"
    mv "$CONF.tmp" "$CONF"
}

# Point /etc/slurm/slurm.conf at our config so `srun` works without SLURM_CONF
# (e.g. inside tools that scrub the environment). A real, non-symlink config
# there is left alone: then callers must `eval "$(local_cluster.sh env)"`.
link_etc_conf() {
    mkdir -p /etc/slurm
    if [ -L /etc/slurm/slurm.conf ] || [ ! -e /etc/slurm/slurm.conf ]; then
        ln -sfn "$CONF" /etc/slurm/slurm.conf
    else
        log "note: /etc/slurm/slurm.conf is a real file; left alone (use: eval \"\$($0 env)\")"
    fi
}

# ------------------------------------------------------------ ports --------
# conf_port KEY DEFAULT: the port our config gives (a config from before the
# port settings has none: SLURM's default then).
conf_port() { local p; p="$(sed -n "s/^$1=//p" "$CONF" 2>/dev/null)"; echo "${p:-$2}"; }

# port_holder PORT: "pid N (name)" of a process listening on TCP port PORT;
# fails if none listens. Reads /proc, so it needs neither ss nor lsof.
port_holder() {
    local hex inode link pid
    hex="$(printf '%04X' "$1")"
    for inode in $(awk -v port=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == port {print $10}' \
                       /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
        link="$(find /proc/[0-9]*/fd -lname "socket:\[$inode\]" -print -quit 2>/dev/null)"
        pid="${link#/proc/}"; pid="${pid%%/*}"
        if [ -n "$pid" ]; then
            echo "pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null))"
        else
            echo "a process not visible here"
        fi
        return 0
    done
    return 1
}

# check_port DAEMON KEY DEFAULT: unless DAEMON is ours and running, stop with
# the process that holds its port and what to do about it.
check_port() {
    local name="$1" port holder
    is_running "$name" && return 0
    port="$(conf_port "$2" "$3")"
    holder="$(port_holder "$port")" || return 0
    log "ERROR: port $port ($name) is taken by $holder, which this script did not start (state dir $STATE_DIR)."
    log "  Another SLURM cluster may be running here: \`bash $0 status\` tells."
    log "  Stop that process, or start this cluster on other ports ('down' it first if part of it runs):"
    log "    HPC_C10D_SLURM_CTLD_PORT=7817 HPC_C10D_SLURM_SLURMD_PORT=7818 bash $0 up"
    exit 1
}

# ------------------------------------------------------------ waiting ------
print_logs() {
    local f
    for f in munged.out slurmctld.out slurmctld.log slurmd.out slurmd.log; do
        [ -f "$STATE_DIR/$f" ] || continue
        echo "----- tail $STATE_DIR/$f -----" >&2
        tail -n 25 "$STATE_DIR/$f" >&2
    done
}

# A failed `up` prints the daemon logs and stops whatever it started, so no
# half-working cluster is left behind.
fail() { log "ERROR: $*"; print_logs; stop_daemons || true; exit 1; }

# last_error DAEMON: the last error or fatal line in its log and output.
last_error() {
    cat "$STATE_DIR/$1.log" "$STATE_DIR/$1.out" 2>/dev/null | grep -iE 'fatal|error' | tail -n 1 || true
}

# wait_for <daemon> <seconds> <command...>: poll every 0.5 s until the
# command succeeds; give up at once if the daemon has exited.
wait_for() {
    local name="$1" secs="$2"; shift 2
    local deadline=$(( $(date +%s) + secs ))
    until "$@" >/dev/null 2>&1; do
        is_running "$name" || fail "$name exited during start-up: $(last_error "$name")"
        [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${secs}s waiting for $name ($*)"
        sleep 0.5
    done
}

munge_ok()  { munge -S "$MUNGE_SOCKET" -n </dev/null | unmunge -S "$MUNGE_SOCKET"; }
# (grep without -q: reads all input, so pipefail never sees a SIGPIPE)
ctld_ok()   { timeout 5 scontrol ping | grep UP >/dev/null; }
# Node is usable once sinfo reports it idle (or already running jobs).
node_ok()   { timeout 5 sinfo -h -N -n "$NODE" -o %t | grep -E '^(idle|mix|alloc)' >/dev/null; }

# ------------------------------------------------------------ commands -----
cmd_up() {
    if all_running && node_ok; then
        log "already up (state dir $STATE_DIR)"
        return 0
    fi
    local t0; t0=$(date +%s)
    # Rewrite the config only when nothing is running (a partially running
    # cluster keeps the config it was started with).
    any_running || write_config
    check_port slurmctld SlurmctldPort 6817
    check_port slurmd SlurmdPort 6818
    install_packages

    start_daemon munged munged --foreground --force \
        --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
        --pid-file="$MUNGE_DIR/munged.pid" \
        --seed-file="$MUNGE_DIR/munged.seed"
    wait_for munged 20 munge_ok

    start_daemon slurmctld slurmctld -D -f "$CONF"
    wait_for slurmctld 30 ctld_ok

    start_daemon slurmd slurmd -D -f "$CONF"
    # If the node was left DOWN/DRAIN by an earlier run, resume it.
    sleep 1
    if timeout 5 sinfo -h -N -n "$NODE" -o %t | grep -E '^(down|drain|drng|fail)' >/dev/null; then
        timeout 5 scontrol update NodeName="$NODE" State=RESUME || true
    fi
    wait_for slurmd "$WAIT_S" node_ok   # node_ok: sinfo shows it idle

    link_etc_conf
    log "up in $(( $(date +%s) - t0 ))s: node $NODE, partition $PARTITION, $CPUS CPUs, SLURM_CONF=$CONF"
    timeout 5 sinfo
}

# terminate NAME...: SIGTERM the recorded pids of these daemons together, wait
# up to 15 s for them to exit, SIGKILL any left, remove their pid files.
# Returns 0 if at least one was running.
terminate() {
    local name pid pids="" alive _
    for name in "$@"; do
        if is_running "$name"; then
            pid="$(cat "$(pidfile "$name")")"
            log "stopping $name (pid $pid)"
            kill -TERM "$pid" 2>/dev/null || true
            pids="$pids $pid"
        fi
    done
    for _ in $(seq 1 30); do
        alive=""
        for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
        [ -z "$alive" ] && break
        sleep 0.5
    done
    for pid in $pids; do
        if kill -0 "$pid" 2>/dev/null; then
            log "pid $pid did not exit, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    for name in "$@"; do rm -f "$(pidfile "$name")"; done
    [ -n "$pids" ]
}

# Kill exactly the pids recorded in our pid files: the slurm daemons first,
# munged (which they use for authentication) last.
stop_daemons() {
    local stopped=1
    terminate slurmd slurmctld && stopped=0
    terminate munged && stopped=0
    return "$stopped"
}

# ours PID: whether process PID talks to this cluster: the SLURM_CONF in its
# environment is our config, or it has none and /etc/slurm/slurm.conf is ours.
ours() {
    local conf
    conf="$(tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^SLURM_CONF=//p')"
    [ "$(readlink -f "${conf:-/etc/slurm/slurm.conf}")" = "$(readlink -f "$CONF")" ]
}

# job_processes: "pid name" of every process of this cluster's jobs: its step
# daemons (slurmstepd, which outlive slurmd) and clients (srun, salloc, sbatch),
# each with all its descendants (the ranks, mpiexec and its proxies), leaving
# out this script and its ancestors.
job_processes() {
    local -A parent=() mine=()
    local dir pid stat fields roots="" queue
    for dir in /proc/[0-9]*; do
        pid="${dir#/proc/}"
        stat="$(cat "$dir/stat" 2>/dev/null)" || continue
        read -r -a fields <<<"${stat##*) }"   # state, ppid, ...: after the (name)
        parent[$pid]="${fields[1]}"
    done
    pid=$$
    while [ -n "$pid" ] && [ "$pid" != 0 ]; do mine[$pid]=1; pid="${parent[$pid]:-}"; done
    for pid in "${!parent[@]}"; do
        [ -z "${mine[$pid]:-}" ] || continue
        case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
            slurmstepd|srun|salloc|sbatch) ours "$pid" && roots="$roots $pid" ;;
        esac
    done
    local -A seen=()
    queue="$roots"
    while [ -n "${queue// /}" ]; do
        read -r pid queue <<<"$queue"
        [ -z "${seen[$pid]:-}" ] && [ -z "${mine[$pid]:-}" ] || continue
        seen[$pid]=1
        echo "$pid $(cat "/proc/$pid/comm" 2>/dev/null || echo '?')"
        for dir in "${!parent[@]}"; do [ "${parent[$dir]}" = "$pid" ] && queue="$queue $dir"; done
    done
}

# stop_job_processes: SIGTERM what job_processes lists, SIGKILL what is left
# after 5 s; say which. Returns 0 if there was any.
stop_job_processes() {
    local found pids pid _ alive
    found="$(job_processes)"
    [ -n "$found" ] || return 1
    log "stopping job processes: $(awk '{printf "%s%s (pid %s)", (NR > 1 ? ", " : ""), $2, $1}' <<<"$found")"
    pids="$(awk '{print $1}' <<<"$found")"
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 1 10); do
        alive=""
        for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
        [ -z "$alive" ] && return 0
        sleep 0.5
    done
    log "still running after 5 s, sending SIGKILL:$alive"
    # shellcheck disable=SC2086
    kill -KILL $alive 2>/dev/null || true
}

cmd_down() {
    # Cancel the jobs first (and give them KillWait to exit), then stop what is
    # left of them (step daemons outlive slurmd; clients and their children may
    # outlive the job), then the daemons.
    local jobs="" did=""
    if is_running slurmctld && is_running slurmd; then
        jobs="$(timeout 5 squeue -h -o %A 2>/dev/null || true)"
        if [ -n "$jobs" ]; then
            log "cancelling jobs: $(tr "\n" " " <<<"$jobs")"
            # shellcheck disable=SC2086
            timeout 10 scancel $jobs 2>/dev/null || true
            wait_jobs_gone 15
            did="cancelled $(wc -l <<<"$jobs") job(s)"
        fi
    fi
    stop_job_processes && did="${did:+$did, }stopped the jobs' processes"
    stop_daemons && did="${did:+$did, }stopped the daemons"
    log "${did:-already down}${did:+: down}"
}

# Wait (at most $1 s) until no job is running or completing.
wait_jobs_gone() {
    local deadline=$(( $(date +%s) + $1 ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        [ -z "$(timeout 5 squeue -h -t RUNNING,COMPLETING,SUSPENDED -o %A 2>/dev/null)" ] && return 0
        sleep 0.5
    done
    log "warning: jobs still running after $1 s"
}

# as_caller CMD...: run CMD with the SLURM_CONF this script was called with.
as_caller() {
    if [ -n "$CALLER_SLURM_CONF" ]; then SLURM_CONF="$CALLER_SLURM_CONF" "$@"; else env -u SLURM_CONF "$@"; fi
}

# other_cluster: "ClusterName=..., config ..." of a SLURM controller that the
# caller's own srun reaches (through the caller's SLURM_CONF or /etc/slurm)
# when that is not ours; nothing otherwise.
other_cluster() {
    command -v scontrol >/dev/null 2>&1 || return 0
    local config name conf
    config="$(as_caller timeout 5 scontrol show config 2>/dev/null)" || return 0
    name="$(sed -n 's/^ClusterName *= *//p' <<<"$config")"
    conf="$(sed -n 's/^SLURM_CONF *= *//p' <<<"$config")"
    [ "$(readlink -f "$conf")" = "$(readlink -f "$CONF")" ] && return 0
    echo "ClusterName=$name, config $conf"
}

cmd_status() {
    local rc=1 other
    if all_running && ctld_ok; then
        echo "our cluster: up (state dir $STATE_DIR, SLURM_CONF=$CONF)"
        timeout 5 sinfo
        timeout 5 squeue
        rc=0
    elif any_running; then
        echo "our cluster: down (partially running; use 'up' to finish or 'down' to stop)"
    else
        echo "our cluster: down"
    fi
    other="$(other_cluster)"
    [ -z "$other" ] || echo "another SLURM cluster answers srun here (that one is not ours): $other"
    return "$rc"
}

cmd_env() {
    echo "export SLURM_CONF=$CONF"
    echo "# the hpc_c10d tests submit jobs only to the cluster this names (tests/support/launch.py)"
    echo "export HPC_C10D_TEST_SLURM_CLUSTER=$CLUSTER"
}

case "${1:-}" in
    up)     cmd_up ;;
    down)   cmd_down ;;
    status) cmd_status ;;
    env)    cmd_env ;;
    logs)   print_logs ;;
    *)      echo "usage: $0 {up|down|status|env|logs}" >&2; exit 2 ;;
esac
