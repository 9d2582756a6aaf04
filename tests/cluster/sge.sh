#!/usr/bin/env bash
# sge.sh - a real, local Grid Engine cluster on one machine, for rlaunch's Grid Engine tests.
#
# Each node nI is a network namespace rlg-nI joined by a veth pair (rlgv-nI <-> eth0) to the
# bridge rlgbr0 (10.215.0.1/24, the head) in the root namespace; the node has 10.215.0.(10+I)/24
# and runs its own sge_execd in its own UTS namespace (hostname nI). The head runs sge_qmaster.
# SGE_ROOT, the cell, the spools and every log live under DIR. See tests/cluster/README.md and
# /work/shared/notes/multihost.md. The names differ from cluster.sh's and slurm.sh's: all three
# can be up at once.
#
# Usage:
#   sge.sh up DIR [N]      bring up n1..nN (1 <= N <= 244, default 3); returns when every queue
#                          instance is up; the client's environment is written to DIR/env
#   sge.sh down DIR        tear down what `up DIR` created (idempotent)
#
# Environment: RLG_READY_TIMEOUT (seconds, default 20) bounds the wait for the daemons;
# RLG_SLOTS (default 2) is the slot count of each node's queue instance;
# RLG_KEEP_ON_FAILURE=1 leaves a half-built cluster in place when `up` fails (default: torn down).

set -euo pipefail
shopt -s nullglob

readonly BRIDGE=rlgbr0
readonly NET=10.215.0
readonly HEAD_IP=$NET.1
readonly NS_PREFIX=rlg-n      # namespace of node I: rlg-nI
readonly VETH_PREFIX=rlgv-n   # bridge-side veth of node I: rlgv-nI (node side: eth0)
readonly QMASTER_PORT=16444   # private ports: a system Grid Engine (6444/6445) is left alone
readonly EXECD_PORT=16445
readonly CELL=rl
readonly MAX_NODES=244        # 10 + N must stay below 255
# Across git worktrees the script's own path differs: lock a fixed file instead.
readonly LOCK_FILE=/run/lock/rlaunch-sge-cluster.lock
# The DIR of the cluster that is up, so that a stale one can be named (and taken down).
readonly OWNER_FILE=/run/lock/rlaunch-sge-cluster.dir
# Debian's gridengine: binaries in /usr/lib/gridengine, scripts and templates in
# /usr/share/gridengine. Our SGE_ROOT links to them.
readonly SGE_LIB=/usr/lib/gridengine
readonly SGE_SHARE=/usr/share/gridengine
readonly QMASTER=$SGE_LIB/sge_qmaster
readonly EXECD=$SGE_LIB/sge_execd
readonly QCONF=$SGE_LIB/qconf
READY_TIMEOUT=${RLG_READY_TIMEOUT:-20}
SLOTS=${RLG_SLOTS:-2}

PROG=sge.sh
# die, warn, now_ms, need_root, node_ip, record, alive, descendants, net_up, net_down
# shellcheck source=netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"

usage() {
    sed -n '/^# Usage:/,/^# Environment/p' "$0" | sed -e 's/^# \{0,1\}//' -e '/^Environment/d' >&2
    exit 2
}

check_tools() {
    local t missing=()
    for t in ip ss unshare setsid flock ps hostname awk tac mount timeout; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    for t in "$QMASTER" "$EXECD" "$SGE_LIB/sge_shepherd" "$SGE_LIB/qrsh_starter" "$QCONF" \
        "$SGE_LIB/qstat" "$SGE_LIB/spoolinit" "$SGE_LIB/spooldefaults" "$SGE_SHARE/util/arch"; do
        [ -x "$t" ] || missing+=("$t")
    done
    [ ${#missing[@]} -eq 0 ] ||
        die "missing tools: ${missing[*]} (install gridengine-master gridengine-exec gridengine-client iproute2 util-linux procps)"
}

# Absolute path of DIR; rejects characters that Grid Engine's files would mangle.
abs_dir() {
    local d=$1
    case $d in *[[:space:]\"\'\\%#=,\;:\[\]]*) die "DIR must not contain whitespace, quotes, '\\', '%', '#', '=', ',', ';', ':' or brackets: $d" ;; esac
    (cd "$d" && pwd -P)
}

# --- processes -----------------------------------------------------------------------------
# True if PID is (still) one of our daemons: its environment names our SGE_ROOT (the daemons
# take no arguments). Guards against killing an unrelated process that reused a recorded PID.
ours() {
    local pid=$1
    [ -r "/proc/$pid/environ" ] || return 1
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SGE_ROOT=$DIR/root"
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
# wait up to ~1 s, then SIGKILL. (sge_qmaster's controlled shutdown takes 5-10 s; nothing of
# this cluster's state is kept, so it does not get them.)
terminate() {
    local pids=$1 p
    for p in $pids; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
    for p in $pids; do kill -CONT "$p" 2>/dev/null || true; done
    wait_dead 20 "$pids" && return 0
    for p in $pids; do kill -KILL -- "-$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
    wait_dead 40 "$pids" && return 0
    warn "warning: some processes did not die: $(for p in $pids; do alive "$p" && echo -n "$p "; done)"
}

# Start a daemon in the foreground (SGE_ND) of its own session and record its PID as
# "PID NAME LOG". Every wrapper execs, so the recorded PID is the daemon's. fd 9 (the lock) is
# not inherited.
start_daemon() {
    local name=$1 log=$2 out=$3
    shift 3
    SGE_ND=1 setsid "$@" </dev/null >>"$out" 2>&1 9<&- &
    echo "$! $name $log" >>"$DIR/pids"
}

# --- up ------------------------------------------------------------------------------------

# The environment every Grid Engine program of this cluster needs (also written to DIR/env).
export_env() {
    export SGE_ROOT=$DIR/root SGE_CELL=$CELL SGE_QMASTER_PORT=$QMASTER_PORT SGE_EXECD_PORT=$EXECD_PORT
    unset SGE_ARCH SGE_CLUSTER_NAME SGE_DEBUG_LEVEL SGE_ND
}

# SGE_ROOT: links to Debian's binaries and utilities, and the cell's common directory.
write_root() {
    local head=$1 root=$DIR/root d
    rm -rf "$root" "$DIR/qmaster" "$DIR/execd" "$DIR/conf"
    mkdir -p "$root/$CELL/common" "$DIR/qmaster/job_scripts" "$DIR/execd" "$DIR/conf/adminhosts"
    for d in bin utilbin lib; do
        mkdir -p "$root/$d"
        ln -s "$SGE_LIB" "$root/$d/$("$SGE_SHARE/util/arch")"
    done
    ln -s "$SGE_SHARE/util" "$root/util"
    # Classic (file) spooling: no Berkeley DB environment to set up, and readable spool files.
    cat >"$root/$CELL/common/bootstrap" <<EOF
# A private Grid Engine cluster (generated by sge.sh)
admin_user              root
default_domain          none
ignore_fqdn             true
spooling_method         classic
spooling_lib            libspoolc
spooling_params         $root/$CELL/common;$DIR/qmaster
binary_path             $root/bin
qmaster_spool_dir       $DIR/qmaster
security_mode           none
listener_threads        2
worker_threads          2
scheduler_threads       1
EOF
    echo "$head" >"$root/$CELL/common/act_qmaster"
    cat >"$root/$CELL/common/settings.sh" <<EOF
SGE_ROOT=$root; export SGE_ROOT
SGE_CELL=$CELL; export SGE_CELL
SGE_QMASTER_PORT=$QMASTER_PORT; export SGE_QMASTER_PORT
SGE_EXECD_PORT=$EXECD_PORT; export SGE_EXECD_PORT
EOF
}

# The global configuration: Debian's default, with root allowed to run jobs (min_uid 0), spools
# and mail kept here, no accounting file, and load reports every second (the scheduler and
# `qsub -sync` learn of ended jobs and tasks from them).
write_global_conf() {
    sed -e "s|^execd_spool_dir .*|execd_spool_dir        $DIR/execd|" \
        -e 's|^min_uid .*|min_uid                0|' \
        -e 's|^min_gid .*|min_gid                0|' \
        -e 's|^mailer .*|mailer                 /bin/true|' \
        -e 's|^load_report_time .*|load_report_time       00:00:01|' \
        -e 's|^reporting_params .*|reporting_params       accounting=false reporting=false flush_time=00:00:15 joblog=false sharelog=00:00:00|' \
        "$SGE_SHARE/default-configuration"
}

# The scheduler: Debian's "normal" profile, run every second and right after a submit or a
# job's end instead of every 15 s.
write_sched_conf() {
    sed -e 's/^schedule_interval .*/schedule_interval                 0:0:1/' \
        -e 's/^flush_submit_sec .*/flush_submit_sec                  1/' \
        -e 's/^flush_finish_sec .*/flush_finish_sec                  1/' \
        "$SGE_SHARE/util/install_modules/inst_schedd_normal.conf"
}

# The parallel environment `rl`: slots filled node by node, and the job's own tasks may start
# on its nodes with `qrsh -inherit` (control_slaves), besides the job script.
write_pe() {
    cat <<'EOF'
pe_name            rl
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $fill_up
control_slaves     TRUE
job_is_first_task  FALSE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
}

# The queue `all.q` of every node, from qconf's template: SLOTS slots a node, the `rl` PE, no
# load alarms (the nodes share one loaded box), job scripts run by their #! line, and a
# temporary directory per node (the nodes share /tmp, and each execd makes and removes
# TMPDIR=<tmpdir>/<job>.<task>.all.q for its part of a job).
write_queue() {
    local n=$1 i hosts="" tmpdirs="/tmp"
    for ((i = 1; i <= n; i++)); do
        hosts+=" n$i"
        tmpdirs+=",[n$i=$DIR/n$i/tmp]"
    done
    "$DIR/client" qconf -sq | sed -e 's/^qname .*/qname                 all.q/' \
        -e "s/^hostlist .*/hostlist             $hosts/" \
        -e "s/^slots .*/slots                 $SLOTS/" \
        -e 's/^pe_list .*/pe_list               rl/' \
        -e 's/^load_thresholds .*/load_thresholds       NONE/' \
        -e 's/^shell_start_mode .*/shell_start_mode      unix_behavior/' \
        -e "s|^tmpdir .*|tmpdir                $tmpdirs|"
}

# qstat's view of all.q: "n1 " for a usable instance, "n1 u" for one in state u (unknown: its
# execd has not reported), one line a node, sorted.
queue_states() {
    timeout -k 1 5 "$DIR/client" qstat -f -q all.q 2>/dev/null </dev/null 9<&- |
        awk '$1 ~ /^all\.q@/ { sub(/^all\.q@/, "", $1); print $1 " " $6 }' | sort -u
}

# The last lines of every daemon's log (and of what it printed), for failure reports.
report_logs() {
    local pid name log
    while read -r pid name log; do
        if alive "$pid"; then echo "  $name (pid $pid) is running; $log ends:" >&2
        else echo "  $name (pid $pid) has exited; $log ends:" >&2; fi
        tail -n 8 "$log" 2>/dev/null | sed 's/^/    /' >&2
        tail -n 4 "$DIR/$name.out" 2>/dev/null | sed 's/^/    (stderr) /' >&2
    done <"$DIR/pids"
}

# Wait (bounded) until the qmaster answers qconf.
wait_qmaster() {
    local deadline=$1 pid
    read -r pid _ <"$DIR/pids"
    until "$DIR/client" qconf -sh >/dev/null 2>&1 </dev/null 9<&-; do
        alive "$pid" || { warn "sge_qmaster exited during startup"; report_logs; return 1; }
        [ "$(now_ms)" -lt "$deadline" ] || { warn "sge_qmaster did not answer within ${READY_TIMEOUT}s"; report_logs; return 1; }
        sleep 0.05
    done
}

# Wait (bounded) until every node's queue instance is up; any daemon exiting fails at once.
wait_ready() {
    local n=$1 deadline=$2 want states pid name log i
    want=$(for ((i = 1; i <= n; i++)); do echo "n$i "; done | sort -u)
    while :; do
        while read -r pid name log; do
            alive "$pid" || { warn "$name exited during startup"; report_logs; return 1; }
        done <"$DIR/pids"
        states=$(queue_states || true)
        [ "$states" = "$want" ] && return 0
        if [ "$(now_ms)" -ge "$deadline" ]; then
            warn "queue instances not all up within ${READY_TIMEOUT}s; qstat says: $(echo "${states:-nothing}" | tr '\n' ',')"
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
        if [ "${RLG_KEEP_ON_FAILURE:-0}" = 1 ]; then
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
    local dir=$1 n=${2:-3} i t0 head
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_NODES ] || die "N must be 1..$MAX_NODES, got '$n'"
    [[ $READY_TIMEOUT =~ ^[0-9]+$ ]] || die "RLG_READY_TIMEOUT must be whole seconds"
    [[ $SLOTS =~ ^[1-9][0-9]*$ ]] || die "RLG_SLOTS must be a positive number"
    need_root
    check_tools
    t0=$(now_ms)
    mkdir -p "$dir"
    DIR=$(abs_dir "$dir")
    [ ! -s "$DIR/created" ] || die "$DIR already holds a cluster; run: $0 down $DIR"
    head=$(hostname -s)
    [[ $head =~ ^[A-Za-z0-9][A-Za-z0-9-]*$ && ! $head =~ ^n[0-9]+$ && $head != head && $head != localhost ]] ||
        die "this host's name '$head' cannot be the qmaster's (or clashes with a node's)"

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
    local port
    for port in $QMASTER_PORT $EXECD_PORT; do
        ! ss -Htln "sport = :$port" 2>/dev/null | grep -q . || die "TCP port $port is in use ($hint)"
    done

    UP_DONE=0
    trap up_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    : >"$DIR/created"
    : >"$DIR/pids"
    rm -f "$DIR/hosts" "$DIR/env" "$DIR"/*.out
    echo "$DIR" >"$OWNER_FILE"

    # --- files (under DIR) ---
    umask 022
    export_env
    write_root "$head"
    # Grid Engine checks every host by name both ways, and the head's own /etc/hosts knows
    # no node (and may map its name to a loopback address). The qmaster and the head's
    # clients (DIR/client) see head.hosts as /etc/hosts instead, in a mount namespace of
    # their own; the nodes see /etc/netns/rlg-nI/hosts. Both say the same.
    local hosts_file="127.0.0.1 localhost
$HEAD_IP $head head"
    # /etc/netns and /run/netns are shared with the other clusters (and ip): `down` removes
    # them when they are empty, even if they were there before (see slurm.sh).
    record dir /etc/netns
    record mnt /run/netns
    for ((i = 1; i <= n; i++)); do
        hosts_file+=$'\n'"$(node_ip "$i") n$i"
        rm -rf "$DIR/n$i"
        mkdir -p "$DIR/n$i/tmp"
        record dir "/etc/netns/$NS_PREFIX$i"
        mkdir -p "/etc/netns/$NS_PREFIX$i"
    done
    for ((i = 1; i <= n; i++)); do printf '%s\n' "$hosts_file" >"/etc/netns/$NS_PREFIX$i/hosts"; done
    printf '%s\n' "$hosts_file" >"$DIR/head.hosts"
    cat >"$DIR/client" <<EOF
#!/bin/sh
# Runs a Grid Engine client (qsub, qrsh, qstat, qdel, qconf, ...) on the head of the cluster
# in $DIR: with its environment, and with head.hosts as /etc/hosts (generated by sge.sh).
[ \$# -gt 0 ] || { echo "usage: \$0 PROGRAM [ARGS...]" >&2; exit 2; }
. '$DIR/root/$CELL/common/settings.sh'
exec unshare --mount sh -c 'mount --bind "\$0" /etc/hosts && exec "\$@"' '$DIR/head.hosts' "\$@"
EOF
    chmod 0755 "$DIR/client"
    write_global_conf >"$DIR/conf/global"
    write_sched_conf >"$DIR/conf/sched"
    write_pe >"$DIR/conf/pe"
    "$SGE_LIB/spoolinit" classic libspoolc "$DIR/root/$CELL/common;$DIR/qmaster" init >"$DIR/spool.out" 2>&1
    {
        "$SGE_LIB/spooldefaults" configuration "$DIR/conf/global"
        "$SGE_LIB/spooldefaults" complexes "$SGE_SHARE/util/resources/centry"
        "$SGE_LIB/spooldefaults" usersets "$SGE_SHARE/util/resources/usersets"
        "$SGE_LIB/spooldefaults" managers root
        # The head runs qconf; an execd registers only from an admin host.
        for h in "$head" $(for ((i = 1; i <= n; i++)); do echo "n$i"; done); do
            echo "hostname $h" >"$DIR/conf/adminhosts/$h"
        done
        "$SGE_LIB/spooldefaults" adminhosts "$DIR/conf/adminhosts"
    } >>"$DIR/spool.out" 2>&1 || { cat "$DIR/spool.out" >&2; die "cannot initialise the spool"; }

    # --- network ---
    net_up "$n"

    # --- daemons ---
    local deadline=$(($(now_ms) + READY_TIMEOUT * 1000))
    start_daemon qmaster "$DIR/qmaster/messages" "$DIR/qmaster.out" \
        unshare --mount sh -c 'mount --bind "$1" /etc/hosts && exec "$2"' sh "$DIR/head.hosts" "$QMASTER"
    wait_qmaster "$deadline" || die "sge_qmaster did not start"
    local q=("$DIR/client" qconf)
    {
        "${q[@]}" -Msconf "$DIR/conf/sched"
        "${q[@]}" -Ap "$DIR/conf/pe"
        write_queue "$n" >"$DIR/conf/queue"
        "${q[@]}" -Aq "$DIR/conf/queue"
        for h in "$head" $(for ((i = 1; i <= n; i++)); do echo "n$i"; done); do "${q[@]}" -as "$h"; done
    } >>"$DIR/qconf.out" 2>&1 </dev/null 9<&- || { cat "$DIR/qconf.out" >&2; die "cannot configure the cluster"; }
    for ((i = 1; i <= n; i++)); do
        start_daemon "execd-n$i" "$DIR/execd/n$i/messages" "$DIR/execd-n$i.out" \
            ip netns exec "$NS_PREFIX$i" unshare --uts \
            sh -c 'hostname "$1" && exec "$2"' sh "n$i" "$EXECD"
    done
    for ((i = 1; i <= n; i++)); do echo "n$i"; done >"$DIR/hosts"
    wait_ready "$n" "$deadline" || die "cluster did not come up"

    {
        echo "SGE_ROOT=$DIR/root"
        echo "SGE_CELL=$CELL"
        echo "SGE_QMASTER_PORT=$QMASTER_PORT"
        echo "SGE_EXECD_PORT=$EXECD_PORT"
    } >"$DIR/env"
    UP_DONE=1
    local ms=$(($(now_ms) - t0))
    warn "$n node(s) up in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s; $DIR/client qstat -f"
}

# --- down ----------------------------------------------------------------------------------

do_down() {
    set +e    # best effort from here on: remove whatever exists
    local created=$DIR/created p pids="" others="" kind name

    # 1. Processes: our daemons, their descendants, and anything in our namespaces (each
    #    job's sge_shepherd outlives its execd; it and the job's processes stay in the node).
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
        net_down
        while read -r kind name; do
            [ "$kind" = dir ] || continue
            case $name in
                /etc/netns/"$NS_PREFIX"[0-9]*) rm -rf -- "$name" ;;
                /etc/netns) rmdir -- "$name" 2>/dev/null || true ;;
            esac
        done < <(tac "$created")    # /etc/netns/rlg-nI before /etc/netns
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
    # One cluster operation at a time on this machine (bridge, namespace names and ports are
    # global): a concurrent `up` then fails cleanly on the existence checks instead of racing.
    # fd 9 is closed for the daemons, so the lock goes with this script.
    exec 9>>"$LOCK_FILE"
    flock 9
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
    esac
}

main "$@"
