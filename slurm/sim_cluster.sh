#!/usr/bin/env bash
# A simulated cluster of 2-4 nodes on one machine: each node is a network namespace with its own
# hostname (UTS namespace) and its own /etc/hosts (mount namespace), cabled through veth pairs to
# a bridge on a private /24; a head namespace on the same bridge runs a SLURM controller, and
# every node runs its own slurmd. MPI jobs between nodes really cross the veths (MPICH on
# libfabric's tcp provider), so the MPI library treats them as different nodes.
#
#   bash slurm/sim_cluster.sh up [--nodes N]   # N = 2..4 (default 2); installs missing Debian packages
#   bash slurm/sim_cluster.sh down             # removes every namespace, mount, file and daemon `up` made
#   bash slurm/sim_cluster.sh status           # up: nodes, addresses, daemons, sinfo (exit 0); down: exit 1
#   eval "$(bash slurm/sim_cluster.sh env)"    # HPC_C10D_SIM_CLUSTER (the designation the tests read),
#                                              # HPC_C10D_SIM_NODES="node1 node2 ...", and the knobs below
#   bash slurm/sim_cluster.sh exec <node> -- CMD...           # CMD inside that node, same cwd and environment
#   bash slurm/sim_cluster.sh mpiexec [MPIEXEC ARGS] -- CMD...  # Hydra's mpiexec (the one beside `python`),
#                                              # started on node1 across the nodes: hostfile, ssh stand-in
#                                              # launcher and the network settings added,
#                                              # e.g. `mpiexec -n 4 -ppn 2 -- python x.py`
#   bash slurm/sim_cluster.sh ompi-mpiexec [MPIEXEC ARGS] -- CMD...  # Open MPI 5's mpiexec (prterun), started
#                                              # on node1 across the nodes: a hostfile with
#                                              # HPC_C10D_SIM_SLOTS slots a node (default 2), PRRTE's ssh launcher
#                                              # pointed at the stand-in, run-as-root and oversubscription allowed;
#                                              # e.g. `ompi-mpiexec -n 4 --map-by ppr:2:node --with-ft ulfm -- python x.py`
#   bash slurm/sim_cluster.sh srun [SRUN ARGS] -- CMD...      # srun in the head namespace, on this cluster's
#                                              # slurmctld, e.g. `srun -N 2 --ntasks-per-node=2 --mpi=pmi2 -- python x.py`
#   bash slurm/sim_cluster.sh link <node> down|up   # unplug / plug a node's cable (the bridge's end of its veth)
#                                              # (up: returns once the node reaches every other one)
#   bash slurm/sim_cluster.sh kill <node>      # SIGKILL every process in the node except slurmd/slurmstepd
#   bash slurm/sim_cluster.sh logs             # the daemons' logs (tails)
#
# Nodes are node1..nodeN at <subnet>.1..N, the head namespace `head` at <subnet>.254; names
# resolve through the cluster's own hosts file, bind-mounted on /etc/hosts inside each node's
# mount namespace (the machine's /etc/hosts is never touched). Each node's UTS and mount
# namespaces are kept by a holder process (`sleep infinity`, pid in <state dir>/pids/node-<node>.pid),
# which also gives the node a /dev/shm of its own (a tmpfs, gone with the node); the rest of the
# file system, /tmp included, is the machine's, as a cluster's shared file system would be;
# a node is entered with nsenter into the holder's namespaces (not `ip netns exec`, which
# remounts /sys and hides the cgroup mounts slurmd needs).
# MPICH jobs get MPIR_CVAR_CH4_NETMOD=ofi and FI_PROVIDER=tcp unless the caller set them: the
# wheel's default (UCX) silently uses shared memory between the namespaces, and UCX_TLS=tcp hangs.
# Hydra reaches the nodes through a stand-in for ssh (<state dir>/bin/node-ssh) that enters the
# target node's namespaces; Open MPI 5's prterun (`ompi-mpiexec`) uses the same stand-in as PRRTE's
# plm_ssh_agent, and its MPI traffic between nodes takes the TCP BTL over eth0 (each node's /dev/shm
# is its own, and PRRTE tells the ranks which node they are on). The stand-in becomes the remote
# shell in the target node, so `kill <node>` ends a node's ssh session with it (on a real cluster
# the ssh client lives on the launching node and ends when its connection does). SLURM: its own munged, slurm.conf (SLURM_CONF; /etc/slurm is not used)
# and ports inside the namespaces, so it coexists with slurm/local_cluster.sh's localhost
# cluster; proctrack/linuxproc, no cgroups.
#
# Runs as root on Linux (network namespaces, veths, bind mounts). Nothing is created in the
# machine's own network namespace: the bridge lives in a namespace of its own. Several clusters
# coexist when each has its own prefix (and state dir). Everything made is recorded in
# <state dir>/created and `down` removes exactly that, daemons by pid.
#
# Environment knobs:
#   HPC_C10D_SIM_PREFIX  names: namespaces <prefix>-node1.., <prefix>-head, <prefix>-br;
#                        the SLURM ClusterName (default hpcsim)
#   HPC_C10D_SIM_SUBNET  first three octets of the private /24 (default 10.77.0; 10/8,
#                        172.16/12 or 192.168/16 only)
#   HPC_C10D_SIM_DIR     state dir (default /tmp/<prefix>)
#   HPC_C10D_SIM_CPUS    CPUs each node advertises to SLURM (default 8; real cores may be fewer)
#   HPC_C10D_SIM_WAIT    seconds to wait for the nodes to become idle (default 60)
#   HPC_C10D_SIM_MPIEXEC the mpiexec the `mpiexec` command runs (default: beside `python` on PATH,
#                        else beside python3, else PATH's mpiexec); must be MPICH's Hydra
#   HPC_C10D_SIM_OMPI_MPIEXEC  the mpiexec `ompi-mpiexec` runs (default: HPC_C10D_SIM_MPIEXEC when that is
#                        Open MPI's, else found as above); must be Open MPI 5's (PRRTE)
#   HPC_C10D_SIM_SLOTS   slots a node has in ompi-mpiexec's hostfile (default 2)
# A second cluster beside the first: HPC_C10D_SIM_PREFIX=simb HPC_C10D_SIM_SUBNET=10.78.0 ... up
# (unset HPC_C10D_SIM_DIR if the first one's `env` set it in that shell).
set -euo pipefail

PREFIX="${HPC_C10D_SIM_PREFIX:-hpcsim}"
SUBNET="${HPC_C10D_SIM_SUBNET:-10.77.0}"
STATE_DIR="${HPC_C10D_SIM_DIR:-/tmp/$PREFIX}"
CPUS="${HPC_C10D_SIM_CPUS:-8}"
WAIT_S="${HPC_C10D_SIM_WAIT:-60}"
SCRIPT="$(readlink -f "${BASH_SOURCE[0]}")"
# shellcheck source=slurm/slurm_conf.sh
. "$(dirname "$SCRIPT")/slurm_conf.sh"

HEAD_IP="$SUBNET.254"
CONF="$STATE_DIR/slurm.conf"
HOSTS="$STATE_DIR/hosts"                # bind-mounted on /etc/hosts inside every namespace
HOSTFILE="$STATE_DIR/hostfile"          # Hydra's -f
LAUNCHER="$STATE_DIR/bin/node-ssh"      # Hydra's -launcher-exec
MANIFEST="$STATE_DIR/created"           # what `up` made, one line each, for `down`
INFO="$STATE_DIR/cluster.env"           # prefix, subnet, nodes of the cluster that `up` made
MUNGE_DIR="$STATE_DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
MUNGE_KEY="$MUNGE_DIR/munge.key"
cluster_name() { tr -c 'a-z0-9_\n' '_' <<<"${PREFIX,,}"; }
CLUSTER="$(cluster_name)"               # SLURM ClusterName

log() { echo "[sim_cluster $PREFIX] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() {
    sed -n '/^#   bash/,/^#   bash slurm\/sim_cluster.sh logs/p' "$SCRIPT" | sed 's/^#//' >&2
    exit 2
}

# ---------------------------------------------------------------- checks --
[[ "$PREFIX" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,30}$ ]] ||
    die "HPC_C10D_SIM_PREFIX=$PREFIX: use letters, digits, '_', '.', '-' (at most 31)"
valid_subnet() {
    local a b c
    IFS=. read -r a b c <<<"$SUBNET"
    [[ "$SUBNET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] && [ "$b" -le 255 ] && [ "$c" -le 255 ] || return 1
    [ "$a" = 10 ] || { [ "$a" = 172 ] && [ "$b" -ge 16 ] && [ "$b" -le 31 ]; } || { [ "$a" = 192 ] && [ "$b" = 168 ]; }
}
valid_subnet || die "HPC_C10D_SIM_SUBNET=$SUBNET: give three octets of a private /24 (10.x.y, 172.16-31.y, 192.168.y)"
need_root() { [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veths, bind mounts)"; }

# ---------------------------------------------------------------- install --
# command -> Debian package
REQUIRED="ip:iproute2 nsenter:util-linux unshare:util-linux munged:munge munge:munge unmunge:munge
slurmctld:slurmctld slurmd:slurmd srun:slurm-client scontrol:slurm-client sinfo:slurm-client
squeue:slurm-client scancel:slurm-client"

install_packages() {
    local missing="" pkgs="" item
    for item in $REQUIRED; do
        command -v "${item%%:*}" >/dev/null 2>&1 && continue
        missing="$missing ${item%%:*}"
        case " $pkgs " in *" ${item#*:} "*) ;; *) pkgs="$pkgs ${item#*:}" ;; esac
    done
    [ -z "$missing" ] && return 0
    # slurm-wlm = slurmctld + slurmd + slurm-client; ask for it as local_cluster.sh does
    case "$pkgs" in *slurm*) pkgs="$(tr ' ' '\n' <<<"$pkgs" | grep -v '^slurm' | tr '\n' ' ') slurm-wlm" ;; esac
    log "missing:$missing -> installing$pkgs via apt"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache show slurmctld >/dev/null 2>&1; then apt-get update -q; fi
    # Debian's postinst scripts would start the system munge/slurm services; deny service starts
    # during the install with a temporary policy-rc.d (unless the box already has one).
    local policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && made_policy=1
    fi
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $pkgs || rc=$?
    if [ "$rc" != 0 ]; then   # stale package lists? refresh once and retry
        rc=0
        # shellcheck disable=SC2086
        apt-get update -q && apt-get install -y -q --no-install-recommends $pkgs || rc=$?
    fi
    [ "$made_policy" = 1 ] && rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get install$pkgs failed (rc=$rc)"
}

# ------------------------------------------------------------- the state --
# The cluster's shape, written by `up`: SIM_PREFIX, SIM_SUBNET, SIM_NODES (the count).
load_info() {
    [ -s "$INFO" ] || return 1
    # shellcheck disable=SC1090
    . "$INFO"
    # A state dir given alone (HPC_C10D_SIM_DIR) names its cluster; a prefix or subnet given as
    # well must be that cluster's.
    if [ "$SIM_PREFIX" != "$PREFIX" ]; then
        [ -z "${HPC_C10D_SIM_PREFIX:-}" ] ||
            die "state dir $STATE_DIR belongs to the cluster with prefix $SIM_PREFIX, not $PREFIX" \
                "(set HPC_C10D_SIM_PREFIX=$SIM_PREFIX, or HPC_C10D_SIM_DIR to this cluster's own dir)"
        PREFIX="$SIM_PREFIX"
        CLUSTER="$(cluster_name)"
    fi
    if [ "$SIM_SUBNET" != "$SUBNET" ]; then
        [ -z "${HPC_C10D_SIM_SUBNET:-}" ] ||
            die "cluster $PREFIX (state dir $STATE_DIR) is on $SIM_SUBNET.0/24, not HPC_C10D_SIM_SUBNET=$SUBNET"
        SUBNET="$SIM_SUBNET"
        HEAD_IP="$SUBNET.254"
    fi
    NNODES="$SIM_NODES"
}
node_names() { local k; for k in $(seq 1 "$1"); do printf 'node%s ' "$k"; done; }
netns_of() { echo "$PREFIX-$1"; }                 # node1 -> hpcsim-node1; head; br
ip_of() { if [ "$1" = head ]; then echo "$HEAD_IP"; else echo "$SUBNET.${1#node}"; fi; }
record() { echo "$*" >>"$MANIFEST"; }             # before making it, so a failed step is undone too

# Our processes, by the name of their pid file: the holders of the nodes' namespaces
# (node-head, node-node1, ...), munged, slurmctld, slurmd-node1, ...
pidfile() { echo "$STATE_DIR/pids/$1.pid"; }
comm_of() { case "$1" in node-*) echo sleep ;; slurmd-*) echo slurmd ;; *) echo "$1" ;; esac; }
# Process $1 exists and is not a zombie (a killed daemon may wait long to be reaped here).
alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [ "${stat%% *}" != Z ]
}
# The pid recorded for $1 is alive and still runs its program.
is_running() {
    local pf pid
    pf="$(pidfile "$1")"
    [ -s "$pf" ] || return 1
    pid="$(cat "$pf")"
    alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(comm_of "$1")" ]
}

# enter NODE CMD...: run CMD in NODE's network, UTS and mount namespaces (its holder's), in this
# directory, with this environment (nsenter execs: no extra process stays between).
enter() {
    local node="$1"; shift
    is_running "node-$node" || die "no node '$node' in cluster $PREFIX (nodes: $(node_names "${NNODES:-0}")head)"
    local wd="$PWD"; [ -d "$wd" ] || wd=/
    exec nsenter --target="$(cat "$(pidfile "node-$node")")" --net --uts --mount --wd="$wd" -- "$@"
}
# in_node NODE CMD...: the same, as a child of this script.
in_node() { (enter "$@"); }

# Whether everything `up` starts is running and answering.
munge_ok() { munge -S "$MUNGE_SOCKET" -n </dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null; }
slurm() { SLURM_CONF="$CONF" in_node head timeout 10 "$@"; }
ctld_ok() { slurm scontrol ping 2>/dev/null | grep UP >/dev/null; }
idle_nodes() { slurm sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 ~ /^(idle|mix|alloc)/ {print $1}' | sort -u | wc -l; }
daemons_running() {
    local node
    is_running munged && is_running slurmctld && is_running node-head || return 1
    for node in $(node_names "$NNODES"); do is_running "node-$node" && is_running "slurmd-$node" || return 1; done
}
cluster_up() { load_info && daemons_running && ctld_ok; }

# ------------------------------------------------------------ bring-up ----
# start_daemon NAME NODE PROGRAM ARGS...: PROGRAM in NODE's namespaces, in a session of its own,
# in the foreground (so that its pid is the one recorded), output to <state dir>/NAME.out.
start_daemon() {
    local name="$1" node="$2" prog="$3" pid
    shift 2
    log "starting $name in $node"
    setsid bash "$SCRIPT" _enter "$node" "$@" </dev/null >>"$STATE_DIR/$name.out" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$(pidfile "$name")"
    for _ in $(seq 1 50); do     # until the exec chain has reached the daemon itself
        alive "$pid" || break
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(basename "$prog")" ] && break
        sleep 0.1
    done
}

# wait_for SECONDS WHAT CMD...: poll until CMD succeeds; fail at once if a daemon has exited.
wait_for() {
    local secs="$1" what="$2" deadline name
    shift 2
    deadline=$(( $(date +%s) + secs ))
    until "$@" >/dev/null 2>&1; do
        for name in $(cd "$STATE_DIR/pids" && ls); do
            name="${name%.pid}"
            is_running "$name" || up_failed "$name exited during start-up: $(last_error "$name")"
        done
        [ "$(date +%s)" -lt "$deadline" ] || up_failed "timed out after ${secs}s waiting for $what"
        sleep 0.2
    done
}

last_error() {
    cat "$STATE_DIR/$1.log" "$STATE_DIR/$1.out" 2>/dev/null | grep -iE 'fatal|error' | tail -n 1 || true
}

print_logs() {
    local f
    for f in "$STATE_DIR"/*.out "$STATE_DIR"/*.log; do
        [ -s "$f" ] || continue
        echo "----- tail $f -----" >&2
        tail -n 25 "$f" >&2
    done
}

up_failed() { log "ERROR: $*"; print_logs; log "undoing what up made"; teardown; exit 1; }

make_namespaces() {
    local node name pid
    [ -d /run/netns ] || record "runnetns"        # `ip netns add` mounts /run/netns the first time
    for node in br head $(node_names "$NNODES"); do
        name="$(netns_of "$node")"
        [ ! -e "/run/netns/$name" ] || up_failed "network namespace $name exists but is not in $MANIFEST: " \
            "another cluster with prefix $PREFIX? (\`ip netns list\`)"
        record "netns $name"
        ip netns add "$name"
        # IPv4 only: no IPv6 link-local chatter or addresses for MPI to pick
        nsenter --net="/run/netns/$name" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 \
            net.ipv6.conf.default.disable_ipv6=1 >/dev/null 2>&1 || true
        ip -n "$name" link set lo up
    done
    # The bridge, in its own namespace; one veth per node (and the head): the bridge's end is
    # named after the node, the node's end is eth0.
    ip -n "$(netns_of br)" link add br0 type bridge
    ip -n "$(netns_of br)" link set br0 up
    for node in head $(node_names "$NNODES"); do
        ip -n "$(netns_of br)" link add "$node" type veth peer name eth0 netns "$(netns_of "$node")"
        ip -n "$(netns_of br)" link set "$node" master br0 up
        ip -n "$(netns_of "$node")" addr add "$(ip_of "$node")/24" dev eth0
        ip -n "$(netns_of "$node")" link set eth0 up
    done
    # Hostname, /etc/hosts and a /dev/shm of its own (MPICH's shared-memory segments are named
    # per job: jobs of two nodes, or of two clusters whose SLURM job ids both start at 1, must not
    # meet there, and what a crashed job leaves goes with the node): a UTS and a mount namespace
    # per node, made by its holder process (nsenter and unshare exec, so the pid is the holder's;
    # it is ready once it runs sleep).
    for node in head $(node_names "$NNODES"); do
        setsid nsenter --net="/run/netns/$(netns_of "$node")" unshare --uts --mount --propagation slave \
            sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && mount -t tmpfs -o mode=1777 shm /dev/shm &&
                   exec sleep infinity' _ "$node" "$HOSTS" \
            </dev/null >>"$STATE_DIR/namespaces.out" 2>&1 9>&- &
        pid=$!
        echo "$pid" >"$(pidfile "node-$node")"
    done
    for node in head $(node_names "$NNODES"); do
        for _ in $(seq 1 50); do is_running "node-$node" && break; sleep 0.1; done
        is_running "node-$node" || up_failed "could not make node $node's namespaces: $(tail -n 3 "$STATE_DIR/namespaces.out")"
    done
}

write_files() {
    local node mem_mb
    mkdir -p "$STATE_DIR/bin" "$STATE_DIR/pids" "$STATE_DIR/ctld" "$STATE_DIR/slurmd" "$MUNGE_DIR"
    chmod 0755 "$STATE_DIR"
    chmod 0711 "$MUNGE_DIR"     # munged: not writable by others, searchable so jobs reach the socket
    {
        echo "127.0.0.1 localhost"
        echo "$HEAD_IP head"
        for node in $(node_names "$NNODES"); do echo "$(ip_of "$node") $node"; done
    } >"$HOSTS"
    node_names "$NNODES" | tr ' ' '\n' | sed '/^$/d' >"$HOSTFILE"

    # Hydra calls its ssh launcher as `ssh [options] HOST COMMAND...`; ssh joins COMMAND with
    # spaces for the remote shell, and so does this stand-in, inside HOST's namespaces. (The
    # stand-in is written at `up`; a running cluster keeps the one it was made with.)
    cat >"$LAUNCHER" <<EOF
#!/bin/bash
# ssh stand-in for MPICH Hydra on the simulated cluster $PREFIX (made by $SCRIPT up)
set -e
while [ \$# -gt 0 ]; do
    case "\$1" in
        -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;    # ssh options that take an argument
        --) shift; break ;;
        -*) shift ;;
        *) break ;;
    esac
done
[ \$# -gt 0 ] || { echo "node-ssh: no host given" >&2; exit 255; }
host="\${1#*@}"; shift
node="\$(awk -v h="\$host" '\$1 == h || \$2 == h {print \$2; exit}' "$HOSTS")"
pid="\$(cat "$STATE_DIR/pids/node-\$node.pid" 2>/dev/null)" && [ "\$(cat /proc/\$pid/comm 2>/dev/null)" = sleep ] ||
    { echo "node-ssh: no node \$host in cluster $PREFIX" >&2; exit 255; }
wd="\$PWD"; [ -d "\$wd" ] || wd=/
[ \$# -gt 0 ] || set -- exec /bin/bash -l
# bash, as root's login shell under sshd: it execs a single command, so this process becomes the
# proxy itself and a signal Hydra sends its launcher reaches the proxy
exec nsenter --target="\$pid" --net --uts --mount --wd="\$wd" -- /bin/bash -c "\$*"
EOF
    chmod 0755 "$LAUNCHER"

    if [ ! -s "$MUNGE_KEY" ]; then
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
    fi
    chmod 0400 "$MUNGE_KEY"
    mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / (NNODES + 1) ))
    {
        cat <<EOF
# Generated by slurm/sim_cluster.sh: the simulated cluster $PREFIX ($NNODES nodes on $SUBNET.0/24).
ClusterName=$CLUSTER
SlurmctldHost=head($HEAD_IP)
SlurmctldPort=6817
SlurmdPort=6818
EOF
        slurm_conf_shared "$STATE_DIR/slurmd/%n" "$STATE_DIR/slurmd/%n.daemon.pid" "$STATE_DIR/slurmd-%n.log"
        for node in $(node_names "$NNODES"); do
            echo "NodeName=$node NodeAddr=$(ip_of "$node") NodeHostname=$node CPUs=$CPUS Sockets=1" \
                 "CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN"
        done
        echo "PartitionName=sim Nodes=node[1-$NNODES] Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF"
}

cmd_up() {
    local want=2
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) [ $# -ge 2 ] || usage; want="$2"; shift 2 ;;
            --nodes=*) want="${1#--nodes=}"; shift ;;
            *) usage ;;
        esac
    done
    [[ "$want" =~ ^[2-4]$ ]] || die "--nodes $want: give 2, 3 or 4"
    need_root
    install_packages
    mkdir -p "$(dirname "$STATE_DIR")"
    exec 9>>"$STATE_DIR.lock" && flock 9   # one up/down at a time per cluster
    if load_info; then
        if cluster_up && [ "$(idle_nodes)" = "$NNODES" ]; then
            [ "$NNODES" = "$want" ] || die "already up with $NNODES nodes; \`down\` it first for $want"
            log "already up ($NNODES nodes, state dir $STATE_DIR)"
            return 0
        fi
        log "partly up (a daemon or namespace is missing): taking it down first"
        teardown
    elif [ -s "$MANIFEST" ]; then
        log "left-overs of an unfinished up: taking them down first"
        teardown
    fi
    local t0 node
    t0=$(date +%s%N)
    NNODES="$want"
    mkdir -p "$STATE_DIR"
    : >"$MANIFEST"
    record "dir $STATE_DIR"
    printf 'SIM_PREFIX=%q\nSIM_SUBNET=%q\nSIM_NODES=%q\n' "$PREFIX" "$SUBNET" "$NNODES" >"$INFO"
    set -o errtrace
    trap 'up_failed "a command failed (line $LINENO: $BASH_COMMAND)"' ERR
    write_files
    make_namespaces

    start_daemon munged head munged --foreground --force --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
        --pid-file="$MUNGE_DIR/munged.pid" --seed-file="$MUNGE_DIR/munged.seed"
    wait_for 20 munged munge_ok
    start_daemon slurmctld head slurmctld -D -f "$CONF"
    wait_for 30 slurmctld ctld_ok
    for node in $(node_names "$NNODES"); do
        mkdir -p "$STATE_DIR/slurmd/$node"
        start_daemon "slurmd-$node" "$node" slurmd -D -N "$node" -f "$CONF"
    done
    all_idle() { [ "$(idle_nodes)" = "$NNODES" ]; }
    wait_for "$WAIT_S" "every node idle in sinfo" all_idle
    trap - ERR
    t0=$(( ($(date +%s%N) - t0) / 100000000 ))
    log "up in $((t0 / 10)).$((t0 % 10))s: $NNODES nodes on $SUBNET.0/24, state dir $STATE_DIR"
    show_status
}

# ------------------------------------------------------------ teardown ----
# pids_in_netns NETNS: every process whose network namespace is NETNS.
pids_in_netns() {
    local ino
    ino="$(stat -L -c %i "/run/netns/$1" 2>/dev/null)" || return 0
    { find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/net' -lname "net:\[$ino\]" 2>/dev/null || true; } |
        cut -d/ -f3
}

# terminate NAME...: SIGTERM these daemons (recorded pids), wait up to 10 s, then SIGKILL.
terminate() {
    local name pid pids="" left
    for name in "$@"; do
        is_running "$name" || { rm -f "$(pidfile "$name")"; continue; }
        pid="$(cat "$(pidfile "$name")")"
        log "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        pids="$pids $pid"
    done
    for _ in $(seq 1 50); do
        left=""
        for pid in $pids; do alive "$pid" && left="$left $pid"; done
        [ -z "$left" ] && break
        sleep 0.2
    done
    for pid in $pids; do
        alive "$pid" && { log "pid $pid did not exit: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
    done
    for name in "$@"; do rm -f "$(pidfile "$name")"; done
}

# Undo everything in the manifest, newest first: jobs, daemons, processes left in our network
# namespaces, the namespaces, the mounts, the state dir.
teardown() {
    [ -s "$MANIFEST" ] || return 0
    local nodes="" name kind what pids
    [ -d "$STATE_DIR/pids" ] && nodes="$(cd "$STATE_DIR/pids" && ls | sed -n 's/^slurmd-\(node[0-9]*\)\.pid$/\1/p')"
    if is_running slurmctld && is_running node-head; then
        local jobs
        jobs="$(slurm squeue -h -o %A 2>/dev/null || true)"
        if [ -n "$jobs" ]; then
            log "cancelling jobs: $(tr '\n' ' ' <<<"$jobs")"
            # shellcheck disable=SC2086
            slurm scancel $jobs 2>/dev/null || true
            sleep 1
        fi
    fi
    terminate $(for name in $nodes; do echo "slurmd-$name"; done) slurmctld
    terminate munged
    terminate $(cd "$STATE_DIR/pids" 2>/dev/null && ls node-*.pid 2>/dev/null | sed 's/\.pid$//')
    # Whatever still runs inside our namespaces (jobs' processes, shells from `exec`) was started
    # in a namespace this script made: it goes with it.
    for name in $(awk '$1 == "netns" {print $2}' "$MANIFEST"); do
        pids="$(pids_in_netns "$name" | tr '\n' ' ')"
        if [ -n "${pids// }" ]; then
            log "killing processes left in $name: $pids"
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null || true
        fi
    done
    tac "$MANIFEST" | while read -r kind what; do
        case "$kind" in
            netns) [ -e "/run/netns/$what" ] && { ip netns del "$what" || log "could not delete netns $what"; } ;;
            runnetns) # ip made /run/netns a mount for us; remove it once no namespace is left in it
                if [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
                    umount /run/netns 2>/dev/null || true
                    rmdir /run/netns 2>/dev/null || true
                fi ;;
            dir) ;;
        esac
    done
    # Only the files `up` made are in the state dir (and the logs the daemons wrote there).
    rm -rf "$STATE_DIR"
}

cmd_down() {
    need_root
    [ -e "$STATE_DIR.lock" ] || { [ -d "$STATE_DIR" ] || { log "already down"; return 0; }; }
    exec 9>>"$STATE_DIR.lock" && flock 9
    if [ ! -s "$MANIFEST" ]; then
        log "already down"
    else
        load_info || true
        teardown
        log "down"
    fi
    rm -f "$STATE_DIR.lock"
}

# -------------------------------------------------------------- status ----
show_status() {
    local node link state
    echo "cluster $PREFIX: up, $NNODES nodes on $SUBNET.0/24 (state dir $STATE_DIR, SLURM cluster $CLUSTER)"
    for node in head $(node_names "$NNODES"); do
        link="$(ip -n "$(netns_of br)" -o link show "$node" 2>/dev/null | grep -o 'state [A-Z]*' | cut -d' ' -f2)"
        if [ "$node" = head ]; then
            state="slurmctld pid $(cat "$(pidfile slurmctld)"), munged pid $(cat "$(pidfile munged)")"
        else
            state="slurmd pid $(cat "$(pidfile "slurmd-$node")" 2>/dev/null)"
        fi
        printf '  %-6s %-15s netns %-20s link %-5s %s\n' "$node" "$(ip_of "$node")" "$(netns_of "$node")" \
            "${link:-?}" "$state"
    done
    SLURM_CONF="$CONF" in_node head timeout 10 sinfo || true
}

cmd_status() {
    if ! load_info; then
        echo "cluster $PREFIX: down (no cluster in $STATE_DIR)"
        return 1
    fi
    if cluster_up; then
        show_status
        return 0
    fi
    echo "cluster $PREFIX: down (partly running; \`up\` to finish it or \`down\` to remove it; state dir $STATE_DIR)"
    return 1
}

cmd_env() {
    load_info || die "cluster $PREFIX is not up (no cluster in $STATE_DIR): \`bash $SCRIPT up\`"
    echo "# the simulated cluster $PREFIX (bash $SCRIPT status); the hpc_c10d tests run their multi-node"
    echo "# stages on the cluster HPC_C10D_SIM_CLUSTER designates"
    echo "export HPC_C10D_SIM_CLUSTER=$STATE_DIR"
    echo "export HPC_C10D_SIM_NODES=\"$(node_names "$NNODES" | sed 's/ $//')\""
    echo "export HPC_C10D_SIM_PREFIX=$PREFIX"
    echo "export HPC_C10D_SIM_SUBNET=$SUBNET"
    echo "export HPC_C10D_SIM_DIR=$STATE_DIR"
    echo "export HPC_C10D_SIM_SCRIPT=$SCRIPT"
    echo "# for direct use: Hydra's hostfile and launcher, the cluster's slurm.conf (the sim_cluster.sh"
    echo "# mpiexec/srun commands pass these themselves)"
    echo "export HPC_C10D_SIM_HOSTFILE=$HOSTFILE"
    echo "export HPC_C10D_SIM_LAUNCHER=$LAUNCHER"
    echo "export HPC_C10D_SIM_SLURM_CONF=$CONF"
    echo "export HPC_C10D_SIM_SLURM_CLUSTER=$CLUSTER"
}

# -------------------------------------------------------------- jobs ------
# The MPI settings for jobs on the cluster, unless the caller chose otherwise.
net_env() {
    export MPIR_CVAR_CH4_NETMOD="${MPIR_CVAR_CH4_NETMOD:-ofi}"
    export FI_PROVIDER="${FI_PROVIDER:-tcp}"
}

# split_args NAME ARGS...: the words before `--` go to the array NAME_OPTS, those after to NAME_CMD
# (without `--`, every word is an option: the launcher tells options from the program itself).
split_args() {
    local -n _opts="$1_OPTS" _cmd="$1_CMD"
    shift
    _opts=(); _cmd=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do _opts+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    _cmd=("$@")
}

find_mpiexec() {
    local py dir
    if [ -n "${HPC_C10D_SIM_MPIEXEC:-}" ]; then echo "$HPC_C10D_SIM_MPIEXEC"; return; fi
    for py in python python3; do
        py="$(command -v "$py" 2>/dev/null)" || continue
        dir="$(dirname "$py")"
        [ -x "$dir/mpiexec" ] && { echo "$dir/mpiexec"; return; }
    done
    command -v mpiexec 2>/dev/null || die "no mpiexec beside python or on PATH (activate the venv: . .venv/bin/activate)"
}

cmd_mpiexec() {
    need_root
    load_info || die "cluster $PREFIX is not up: \`bash $SCRIPT up\`"
    local MPI_OPTS MPI_CMD mpiexec a hosts
    split_args MPI "$@"
    mpiexec="$(find_mpiexec)"
    "$mpiexec" --version 2>&1 | grep HYDRA >/dev/null ||
        die "$mpiexec is not MPICH's Hydra (the simulated cluster launches through Hydra's ssh launcher)"
    hosts=(-f "$HOSTFILE")       # every node, one slot each: -ppn N puts N ranks on each
    for a in "${MPI_OPTS[@]}"; do
        case "$a" in -f|-hostfile|-machinefile|-hosts|-host) hosts=() ;; esac   # the caller's hosts instead
    done
    net_env
    enter node1 "$mpiexec" -launcher ssh -launcher-exec "$LAUNCHER" "${hosts[@]}" "${MPI_OPTS[@]}" "${MPI_CMD[@]}"
}

find_ompi_mpiexec() {
    local m
    for m in "${HPC_C10D_SIM_OMPI_MPIEXEC:-}" "${HPC_C10D_SIM_MPIEXEC:-}"; do
        [ -n "$m" ] && "$m" --version 2>&1 | grep -E 'Open MPI|PRRTE|prterun' >/dev/null && { echo "$m"; return; }
    done
    [ -n "${HPC_C10D_SIM_OMPI_MPIEXEC:-}" ] && die "HPC_C10D_SIM_OMPI_MPIEXEC=$HPC_C10D_SIM_OMPI_MPIEXEC is not Open MPI's mpiexec"
    HPC_C10D_SIM_MPIEXEC="" find_mpiexec
}

# Open MPI 5's mpiexec (prterun) from node1 across the nodes, through PRRTE's ssh launcher.
cmd_ompi_mpiexec() {
    need_root
    load_info || die "cluster $PREFIX is not up: \`bash $SCRIPT up\`"
    local MPI_OPTS MPI_CMD mpiexec a hosts node slots="${HPC_C10D_SIM_SLOTS:-2}" hostfile
    [[ "$slots" =~ ^[1-9][0-9]*$ ]] || die "HPC_C10D_SIM_SLOTS=$slots: give a positive number"
    split_args MPI "$@"
    mpiexec="$(find_ompi_mpiexec)"
    "$mpiexec" --version 2>&1 | grep -E 'Open MPI|PRRTE|prterun' >/dev/null ||
        die "$mpiexec is not Open MPI's mpiexec (set HPC_C10D_SIM_OMPI_MPIEXEC, or activate an Open MPI venv)"
    hostfile="$STATE_DIR/hostfile-ompi-$slots"   # every node with $slots slots (PRRTE's hostfile syntax)
    for node in $(node_names "$NNODES"); do echo "$node slots=$slots"; done >"$hostfile"
    hosts=(--hostfile "$hostfile")
    for a in "${MPI_OPTS[@]}"; do
        case "$a" in --hostfile|-hostfile|--machinefile|-machinefile|--host|-host|-H) hosts=() ;; esac
    done
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export PRTE_MCA_rmaps_default_mapping_policy="${PRTE_MCA_rmaps_default_mapping_policy:-:oversubscribe}"
    enter node1 "$mpiexec" --prtemca plm_ssh_agent "$LAUNCHER" "${hosts[@]}" "${MPI_OPTS[@]}" "${MPI_CMD[@]}"
}

cmd_srun() {
    need_root
    load_info || die "cluster $PREFIX is not up: \`bash $SCRIPT up\`"
    local SRUN_OPTS SRUN_CMD var
    split_args SRUN "$@"
    # Inside another cluster's job, its SLURM_* variables would make srun look for that job here.
    if [ -n "${SLURM_CLUSTER_NAME:-}" ] && [ "$SLURM_CLUSTER_NAME" != "$CLUSTER" ]; then
        for var in $(compgen -e | grep '^SLURM_'); do unset "$var"; done
    fi
    export SLURM_CONF="$CONF"
    net_env
    enter head srun "${SRUN_OPTS[@]}" "${SRUN_CMD[@]}"
}

cmd_exec() {
    need_root
    load_info || die "cluster $PREFIX is not up: \`bash $SCRIPT up\`"
    [ $# -ge 1 ] || usage
    local node="$1"; shift
    [ "${1:-}" = "--" ] && shift
    [ $# -ge 1 ] || set -- "${SHELL:-/bin/bash}"
    enter "$node" "$@"
}

check_node() {
    case "$1" in
        head) ;;
        node[1-9]) [ "${1#node}" -le "$NNODES" ] || die "no node $1 (nodes: $(node_names "$NNODES"))" ;;
        *) die "no node $1 (nodes: $(node_names "$NNODES")head)" ;;
    esac
}

# After a node's link comes back up, until the node reaches every other namespace of the cluster:
# neighbour (ARP) entries left from the time it was down are forgotten everywhere first. Twice a job
# started right after a link came back failed with node2 unable to connect to node1 ("No route to
# host"). A TCP connection to port 1 is refused when the peer is reachable.
wait_reachable() {
    local node="$1" ns peer deadline=$((SECONDS + 15)) left answer
    for ns in head $(node_names "$NNODES"); do ip -n "$(netns_of "$ns")" neigh flush all 2>/dev/null || true; done
    while :; do
        left=""
        for peer in head $(node_names "$NNODES"); do
            [ "$peer" = "$node" ] && continue
            answer="$(in_node "$node" timeout 3 bash -c "exec 3<>/dev/tcp/$(ip_of "$peer")/1" 2>&1)" || true
            [[ "$answer" == *refused* ]] || left="$left $peer"
        done
        [ -z "$left" ] && return 0
        [ $SECONDS -lt $deadline ] || die "$node does not reach$left 15 s after its link came up"
        sleep 0.2
    done
}

cmd_link() {
    need_root
    load_info || die "cluster $PREFIX is not up"
    [ $# = 2 ] && [[ "$2" =~ ^(up|down)$ ]] || usage
    check_node "$1"
    ip -n "$(netns_of br)" link set "$1" "$2"
    [ "$2" = down ] || wait_reachable "$1"
    log "$1's link is $2"
}

cmd_kill() {
    need_root
    load_info || die "cluster $PREFIX is not up"
    [ $# = 1 ] || usage
    check_node "$1"
    local pid comm keep="" victims=""
    keep="$(cat "$(pidfile "node-$1")" "$(pidfile "slurmd-$1")" 2>/dev/null | tr '\n' ' ')"
    [ "$1" = head ] && keep="$keep $(cat "$(pidfile slurmctld)" "$(pidfile munged)" 2>/dev/null | tr '\n' ' ')"
    for pid in $(pids_in_netns "$(netns_of "$1")"); do
        comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || continue
        case " $keep " in *" $pid "*) continue ;; esac
        [ "$comm" = slurmstepd ] && continue
        victims="$victims $pid"
    done
    if [ -z "$victims" ]; then log "nothing runs on $1"; return 0; fi
    # shellcheck disable=SC2086
    kill -KILL $victims 2>/dev/null || true
    log "killed on $1:$victims"
}

case "${1:-}" in
    up)      shift; cmd_up "$@" ;;
    down)    cmd_down ;;
    status)  cmd_status ;;
    env)     cmd_env ;;
    exec)    shift; cmd_exec "$@" ;;
    mpiexec) shift; cmd_mpiexec "$@" ;;
    ompi-mpiexec) shift; cmd_ompi_mpiexec "$@" ;;
    srun)    shift; cmd_srun "$@" ;;
    link)    shift; cmd_link "$@" ;;
    kill)    shift; cmd_kill "$@" ;;
    logs)    load_info || true; print_logs ;;
    _enter)  shift; load_info || true; enter "$@" ;;   # for start_daemon
    *)       usage ;;
esac
