#!/usr/bin/env bash
# slurm.sh - a real, local Slurm cluster on one machine, for rlaunch's Slurm tests.
#
# Each node nI is a network namespace rls-nI joined by a veth pair (rlsv-nI <-> eth0) to the
# bridge rlsbr0 (10.214.0.1/24, the head) in the root namespace; the node has 10.214.0.(10+I)/24
# and runs its own `slurmd -D` in its own UTS namespace (hostname nI). The head runs a private
# munged and slurmctld. Everything they write lives under DIR. See tests/cluster/README.md and
# /work/shared/notes/multihost.md. The names differ from cluster.sh's: both can be up at once.
#
# Usage:
#   slurm.sh up DIR [N]    bring up n1..nN (1 <= N <= 244, default 3); returns when sinfo shows
#                          every node idle; the client's environment is written to DIR/env
#   slurm.sh down DIR      tear down what `up DIR` created (idempotent)
#
# Environment: RLS_READY_TIMEOUT (seconds, default 20) bounds the wait for idle nodes;
# RLS_CPUS (default 2) is the CPU count each node declares (the box's own count does not matter);
# RLS_KEEP_ON_FAILURE=1 leaves a half-built cluster in place when `up` fails (default: torn down).

set -euo pipefail
shopt -s nullglob

readonly BRIDGE=rlsbr0
readonly NET=10.214.0
readonly HEAD_IP=$NET.1
readonly NS_PREFIX=rls-n      # namespace of node I: rls-nI
readonly VETH_PREFIX=rlsv-n   # bridge-side veth of node I: rlsv-nI (node side: eth0)
readonly CTLD_PORT=16817      # private ports: a system Slurm (6817/6818) is left alone
readonly SLURMD_PORT=16818
readonly MAX_NODES=244        # 10 + N must stay below 255
# Across git worktrees the script's own path differs: lock a fixed file instead.
readonly LOCK_FILE=/run/lock/rlaunch-slurm-cluster.lock
# The DIR of the cluster that is up, so that a stale one can be named (and taken down).
readonly OWNER_FILE=/run/lock/rlaunch-slurm-cluster.dir
readonly MUNGED=/usr/sbin/munged
readonly SLURMCTLD=/usr/sbin/slurmctld-wlm
readonly SLURMD=/usr/sbin/slurmd-wlm
readonly SLURMSTEPD=/usr/sbin/slurmstepd-wlm
READY_TIMEOUT=${RLS_READY_TIMEOUT:-20}
CPUS=${RLS_CPUS:-2}

PROG=slurm.sh
die() { echo "$PROG: error: $*" >&2; exit 1; }
warn() { echo "$PROG: $*" >&2; }

usage() {
    sed -n '/^# Usage:/,/^# Environment/p' "$0" | sed -e 's/^# \{0,1\}//' -e '/^Environment/d' >&2
    exit 2
}

now_ms() { local t=${EPOCHREALTIME/./}; echo $((10#$t / 1000)); }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

check_tools() {
    local t missing=()
    for t in ip unshare setsid flock ps hostname awk tac sinfo; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    for t in "$MUNGED" "$SLURMCTLD" "$SLURMD" "$SLURMSTEPD"; do [ -x "$t" ] || missing+=("$t"); done
    [ ${#missing[@]} -eq 0 ] ||
        die "missing tools: ${missing[*]} (install slurmctld slurmd slurm-client munge iproute2 util-linux procps)"
}

# Absolute path of DIR; rejects characters that slurm.conf or munged options would mangle.
abs_dir() {
    local d=$1
    case $d in *[[:space:]\"\'\\%#=,]*) die "DIR must not contain whitespace, quotes, '\\', '%', '#', '=' or ',': $d" ;; esac
    (cd "$d" && pwd -P)
}

node_ip() { echo "$NET.$((10 + $1))"; }

# --- processes -----------------------------------------------------------------------------

# True if PID exists and is not a zombie.
alive() {
    local st
    [ -r "/proc/$1/stat" ] || return 1
    st=$(cut -d')' -f2 "/proc/$1/stat" 2>/dev/null | awk '{print $1}') || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

# True if PID is (still) one of our daemons: its command line names a file under DIR.
# Guards against killing an unrelated process that reused a recorded PID.
ours() {
    local pid=$1 cmd
    [ -r "/proc/$pid/cmdline" ] || return 1
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmd == *" $DIR/"* || $cmd == *"=$DIR/"* ]]
}

# All descendants of the given PIDs (one ps snapshot).
descendants() {
    [ $# -gt 0 ] || return 0
    ps -e -o pid=,ppid= | awk -v roots="$*" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) want[r[i]] = 1 }
        { kids[$2] = kids[$2] " " $1 }
        END {
            for (p in want) queue[++q] = p
            while (q > 0) {
                p = queue[q--]
                m = split(kids[p], c, " ")
                for (i = 1; i <= m; i++) if (!(c[i] in seen)) { seen[c[i]] = 1; print c[i]; queue[++q] = c[i] }
            }
        }'
}

# Wait up to TRIES times 50 ms until none of PIDS is alive.
wait_dead() {
    local tries=$1 pids=$2 p t left
    for ((t = 0; t < tries; t++)); do
        left=0
        for p in $pids; do alive "$p" && { left=1; break; }; done
        [ $left = 1 ] || return 0
        sleep 0.05
    done
    return 1
}

# SIGTERM the given PIDs (and the process groups the daemons lead: setsid made PGID == PID),
# wait up to ~3 s, then SIGKILL.
terminate() {
    local pids=$1 p
    for p in $pids; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
    for p in $pids; do kill -CONT "$p" 2>/dev/null || true; done
    wait_dead 60 "$pids" && return 0
    for p in $pids; do kill -KILL -- "-$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
    wait_dead 40 "$pids" && return 0
    warn "warning: some processes did not die: $(for p in $pids; do alive "$p" && echo -n "$p "; done)"
}

# Start a daemon in the foreground of its own session and record its PID as "PID NAME LOG".
# Every wrapper execs, so the recorded PID is the daemon's. fd 9 (the lock) is not inherited.
start_daemon() {
    local name=$1 log=$2
    shift 2
    setsid "$@" </dev/null >>"$log" 2>&1 9<&- &
    echo "$! $name $log" >>"$DIR/pids"
}

# --- up ------------------------------------------------------------------------------------

record() { echo "$1 $2" >>"$DIR/created"; }

write_slurm_conf() {
    local n=$1 ctld_host=$2
    cat <<EOF
# A private Slurm cluster of $n fake nodes (generated by slurm.sh)
ClusterName=rls
SlurmctldHost=$ctld_host($HEAD_IP)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/run/munge.socket
StateSaveLocation=$DIR/ctld/state
SlurmctldPidFile=$DIR/ctld/slurmctld.pid
SlurmctldLogFile=$DIR/ctld/slurmctld.log
SlurmdSpoolDir=$DIR/%n/spool
SlurmdPidFile=$DIR/%n/slurmd.pid
SlurmdLogFile=$DIR/%n/slurmd.log
PlugStackConfig=$DIR/plugstack.conf
MailProg=/bin/true
# No cgroups: the nodes' /sys (remounted by ip netns exec) has none. slurmd still wants a
# cgroup filesystem to start (cgroup.conf names v1; each slurmd gets an empty tmpfs there).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobContainerType=job_container/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# Nodes come back by themselves; the box's real CPU count does not cap the declared one.
ReturnToService=2
SlurmdParameters=config_overrides
# Fast teardown of cancelled jobs and steps (SIGTERM, then SIGKILL after KillWait).
KillWait=2
UnkillableStepTimeout=20
InactiveLimit=0
# sbatch --wait polls after 2 s, then every 8 s unless MinJobAge <= 4 keeps it at 2 s.
MinJobAge=4
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$DIR/%n/tmp
NodeName=DEFAULT CPUs=$CPUS RealMemory=1000 State=UNKNOWN
EOF
    local i
    for ((i = 1; i <= n; i++)); do echo "NodeName=n$i NodeAddr=$(node_ip "$i") NodeHostname=n$i"; done
    echo "PartitionName=all Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP"
}

# Node states as sinfo reports them: "n1 idle" lines, sorted.
node_states() {
    SLURM_CONF=$DIR/slurm.conf timeout -k 1 5 sinfo -h -N -o '%N %T' 2>/dev/null </dev/null 9<&- | sort -u
}

# The last lines of every daemon's log, for failure reports. (Slurm's daemons in the foreground
# write each line twice there: to the log file and, with a prefix, to stderr.)
report_logs() {
    local pid name log
    while read -r pid name log; do
        if alive "$pid"; then echo "  $name (pid $pid) is running; $log ends:" >&2
        else echo "  $name (pid $pid) has exited; $log ends:" >&2; fi
        tail -n 12 "$log" 2>/dev/null | sed 's/^/    /' >&2
    done <"$DIR/pids"
}

# Wait (bounded) until the munged socket exists and munged is alive.
wait_munged() {
    local deadline=$1 pid
    read -r pid _ <"$DIR/pids"
    until [ -S "$DIR/munge/run/munge.socket" ]; do
        alive "$pid" || { warn "munged exited during startup"; report_logs; return 1; }
        [ "$(now_ms)" -lt "$deadline" ] || { warn "munged did not create its socket within ${READY_TIMEOUT}s"; report_logs; return 1; }
        sleep 0.02
    done
}

# Wait (bounded) until sinfo shows all N nodes idle; any daemon exiting fails at once.
wait_idle() {
    local n=$1 deadline=$2 want states pid name log i
    want=$(for ((i = 1; i <= n; i++)); do echo "n$i idle"; done | sort -u)
    while :; do
        while read -r pid name log; do
            alive "$pid" || { warn "$name exited during startup"; report_logs; return 1; }
        done <"$DIR/pids"
        states=$(node_states || true)
        [ "$states" = "$want" ] && return 0
        if [ "$(now_ms)" -ge "$deadline" ]; then
            warn "nodes not all idle within ${READY_TIMEOUT}s; sinfo says: $(echo "${states:-nothing}" | tr '\n' ',')"
            report_logs
            return 1
        fi
        sleep 0.1
    done
}

up_cleanup() {
    local rc=$?
    # Finish the teardown even if whoever reads our stderr has gone (a closed pipe).
    set +e
    trap '' PIPE INT TERM
    if [ "${UP_DONE:-0}" != 1 ]; then
        if [ "${RLS_KEEP_ON_FAILURE:-0}" = 1 ]; then
            warn "up failed; leaving the partial cluster (run: $0 down $DIR)"
        else
            warn "up failed; tearing down what was created"
            (do_down) || true
        fi
        [ $rc -ne 0 ] || rc=1
    fi
    exit $rc
}

cmd_up() {
    [ $# -ge 1 ] && [ $# -le 2 ] || usage
    local dir=$1 n=${2:-3} i t0 ctld_host
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_NODES ] || die "N must be 1..$MAX_NODES, got '$n'"
    [[ $READY_TIMEOUT =~ ^[0-9]+$ ]] || die "RLS_READY_TIMEOUT must be whole seconds"
    [[ $CPUS =~ ^[1-9][0-9]*$ ]] || die "RLS_CPUS must be a positive number"
    need_root
    check_tools
    t0=$(now_ms)
    mkdir -p "$dir"
    DIR=$(abs_dir "$dir")
    [ ! -s "$DIR/created" ] || die "$DIR already holds a cluster; run: $0 down $DIR"
    ctld_host=$(hostname -s)
    [[ $ctld_host =~ ^[A-Za-z0-9][A-Za-z0-9-]*$ && ! $ctld_host =~ ^n[0-9]+$ ]] ||
        die "this host's name '$ctld_host' cannot be the controller's (or clashes with a node's)"

    # Refuse to touch anything that already exists (another cluster, a stale run, a real network).
    local hint="stale cluster? run '$0 down' on its DIR" owner=""
    [ -f "$OWNER_FILE" ] && read -r owner <"$OWNER_FILE"
    [ -z "$owner" ] || hint="the cluster of $owner is up or was not taken down: run '$0 down $owner'"
    ip link show "$BRIDGE" >/dev/null 2>&1 && die "interface $BRIDGE already exists ($hint)"
    local route
    route=$(ip -4 route show to match "$HEAD_IP" | grep -v '^default' || true)
    [ -z "$route" ] || die "$NET.0/24 is already routed in the root namespace: ${route%%$'\n'*}"
    for ((i = 1; i <= n; i++)); do
        [ ! -e "/run/netns/$NS_PREFIX$i" ] || die "network namespace $NS_PREFIX$i already exists ($hint)"
        ! ip link show "$VETH_PREFIX$i" >/dev/null 2>&1 || die "interface $VETH_PREFIX$i already exists ($hint)"
        [ ! -e "/etc/netns/$NS_PREFIX$i" ] || die "/etc/netns/$NS_PREFIX$i already exists ($hint)"
    done

    UP_DONE=0
    trap up_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    : >"$DIR/created"
    : >"$DIR/pids"
    rm -f "$DIR/hosts" "$DIR/env"
    echo "$DIR" >"$OWNER_FILE"

    # --- files (under DIR) ---
    umask 022
    rm -rf "$DIR/munge" "$DIR/ctld"
    # The socket's directory (and those above it) must be a+x: every client reaches it.
    mkdir -p -m 0755 "$DIR/munge/run" "$DIR/ctld/state"
    head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
    chmod 0400 "$DIR/munge/munge.key"
    : >"$DIR/plugstack.conf"
    local hosts_file="127.0.0.1 localhost
::1 localhost ip6-localhost ip6-loopback
$HEAD_IP head $ctld_host"
    # /etc/netns and /run/netns are shared with cluster.sh (and ip): `down` removes them when
    # they are empty, even if they were there before. A cluster.sh that went down while this
    # cluster was up could not remove its own (ours were inside them), and nobody else would.
    record dir /etc/netns
    record mnt /run/netns
    for ((i = 1; i <= n; i++)); do
        hosts_file+=$'\n'"$(node_ip "$i") n$i"
        rm -rf "$DIR/n$i"
        mkdir -p "$DIR/n$i/spool" "$DIR/n$i/tmp"
        # Seen as /etc/hosts inside the node (ip netns exec bind-mounts /etc/netns/NS/*).
        record dir "/etc/netns/$NS_PREFIX$i"
        mkdir -p "/etc/netns/$NS_PREFIX$i"
    done
    for ((i = 1; i <= n; i++)); do printf '%s\n' "$hosts_file" >"/etc/netns/$NS_PREFIX$i/hosts"; done
    write_slurm_conf "$n" "$ctld_host" >"$DIR/slurm.conf"
    echo "CgroupPlugin=cgroup/v1" >"$DIR/cgroup.conf"

    # --- network ---
    record link "$BRIDGE"
    ip link add "$BRIDGE" type bridge
    ip link set "$BRIDGE" addrgenmode none      # no IPv6 link-local chatter on our links
    ip addr add "$HEAD_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 1; i <= n; i++)); do
        local ns=$NS_PREFIX$i veth=$VETH_PREFIX$i
        record netns "$ns"
        ip netns add "$ns"
        record link "$veth"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" addrgenmode none
        ip link set "$veth" master "$BRIDGE" up
        ip -n "$ns" -batch - <<EOF
link set lo up
link set eth0 addrgenmode none
addr add $(node_ip "$i")/24 dev eth0
link set eth0 up
EOF
    done

    # --- daemons ---
    local deadline=$(($(now_ms) + READY_TIMEOUT * 1000))
    start_daemon munged "$DIR/munge/munged.log" "$MUNGED" --foreground \
        --socket="$DIR/munge/run/munge.socket" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    wait_munged "$deadline" || die "munged did not start"
    start_daemon slurmctld "$DIR/ctld/slurmctld.log" "$SLURMCTLD" -D -c -f "$DIR/slurm.conf"
    # slurmd 22.05 will not start without a cgroup filesystem, even with linuxproc and
    # task/none, and ip netns exec hides the host's: an empty tmpfs in the node's own mount
    # namespace satisfies it (cgroup.conf: v1), and nothing of the host's cgroups is used.
    for ((i = 1; i <= n; i++)); do
        start_daemon "slurmd-n$i" "$DIR/n$i/slurmd.log" \
            ip netns exec "$NS_PREFIX$i" unshare --uts \
            sh -c 'hostname "$1" && mount -t tmpfs -o mode=0755 rls-cgroup /sys/fs/cgroup && exec "$2" -D -N "$1" -f "$3" -d "$4"' \
            sh "n$i" "$SLURMD" "$DIR/slurm.conf" "$SLURMSTEPD"
    done
    for ((i = 1; i <= n; i++)); do echo "n$i"; done >"$DIR/hosts"
    wait_idle "$n" "$deadline" || die "cluster did not come up"

    echo "SLURM_CONF=$DIR/slurm.conf" >"$DIR/env"
    UP_DONE=1
    local ms=$(($(now_ms) - t0))
    warn "$n node(s) idle in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s; SLURM_CONF=$DIR/slurm.conf sinfo"
}

# --- down ----------------------------------------------------------------------------------

do_down() {
    set +e    # best effort from here on: remove whatever exists
    local created=$DIR/created p pids="" others="" kind name

    # 1. Processes: our daemons, their descendants (slurmstepd daemonizes away from slurmd, but
    #    it and its tasks stay inside the node's namespace), and anything in our namespaces.
    if [ -f "$DIR/pids" ]; then
        while read -r p _; do
            if [[ $p =~ ^[0-9]+$ ]] && alive "$p" && ours "$p"; then pids+=" $p"; fi
        done <"$DIR/pids"
    fi
    # shellcheck disable=SC2086
    [ -z "$pids" ] || others=$(descendants $pids | tr '\n' ' ')
    if [ -f "$created" ]; then
        while read -r kind name; do
            [ "$kind" = netns ] && [ -e "/run/netns/$name" ] || continue
            others+=" $(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')"
        done <"$created"
    fi
    # Never ourselves or our ancestors.
    local self=" $$ $BASHPID $PPID "
    pids=$(for p in $pids $others; do [[ $self == *" $p "* ]] || echo "$p"; done | sort -un | tr '\n' ' ')
    [ -z "${pids// /}" ] || terminate "$pids"

    # 2. Network and files, in the order: namespaces, links, directories, mounts.
    if [ -f "$created" ]; then
        while read -r kind name; do
            [ "$kind" = netns ] || continue
            ip netns del "$name" 2>/dev/null || true
        done <"$created"
        while read -r kind name; do
            [ "$kind" = link ] || continue
            ip link del "$name" 2>/dev/null || true
        done < <(tac "$created")    # veths before the bridge
        while read -r kind name; do
            [ "$kind" = dir ] || continue
            case $name in
                /etc/netns/"$NS_PREFIX"[0-9]*) rm -rf -- "$name" ;;
                /etc/netns) rmdir -- "$name" 2>/dev/null || true ;;
            esac
        done < <(tac "$created")    # /etc/netns/rls-nI before /etc/netns
        while read -r kind name; do
            [ "$kind" = mnt ] && [ "$name" = /run/netns ] || continue
            # Only if no namespace (ours or another cluster's) is left in it.
            if [ -d /run/netns ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
                umount /run/netns 2>/dev/null || true
                rmdir /run/netns 2>/dev/null || true
            fi
        done <"$created"
    fi
    local owner=""
    [ -f "$OWNER_FILE" ] && read -r owner <"$OWNER_FILE"
    [ "$owner" != "$DIR" ] || rm -f "$OWNER_FILE"
    rm -f "$DIR/created" "$DIR/pids" "$DIR/env"
    return 0
}

cmd_down() {
    [ $# -eq 1 ] || usage
    need_root
    [ -d "$1" ] || return 0
    DIR=$(abs_dir "$1")
    do_down
}

main() {
    [ $# -ge 1 ] || usage
    local cmd=$1
    shift
    case $cmd in
        up | down) ;;
        *) usage ;;
    esac
    # One cluster operation at a time on this machine (bridge and namespace names are global):
    # a concurrent `up` then fails cleanly on the existence checks instead of racing. fd 9 is
    # closed for the daemons, so the lock goes with this script.
    exec 9>>"$LOCK_FILE"
    flock 9
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
    esac
}

main "$@"
