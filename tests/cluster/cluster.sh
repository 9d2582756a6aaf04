#!/usr/bin/env bash
# cluster.sh - fake multi-host cluster on one machine for rlaunch's multi-host tests.
#
# Each node nI is a network namespace rl-nI joined by a veth pair (rlv-nI <-> eth0) to the
# bridge rlbr0 (10.213.0.1/24) in the root namespace; the node has 10.213.0.(10+I)/24 and its own
# sshd in its own UTS namespace (hostname nI). See tests/cluster/README.md and
# /work/shared/notes/multihost.md.
#
# Usage:
#   cluster.sh up DIR N          bring up n1..nN (1 <= N <= 244); state, keys, logs go to DIR
#   cluster.sh down DIR          tear down what `up DIR` created (idempotent)
#   cluster.sh stop-sshd DIR I   stop node I's sshd (new connections are refused)
#   cluster.sh start-sshd DIR I  start it again and wait until it accepts connections
#   cluster.sh link-down DIR I   set node I's bridge-side veth down (no route, ~3 s to fail)
#   cluster.sh link-up DIR I     undo link-down
#
# Environment: RLC_READY_TIMEOUT (seconds, default 20) bounds the wait for the sshds;
# RLC_KEEP_ON_FAILURE=1 leaves a half-built cluster in place when `up` fails (default: torn down).

set -euo pipefail
shopt -s nullglob

readonly BRIDGE=rlbr0
readonly NET=10.213.0
readonly HEAD_IP=$NET.1
readonly NS_PREFIX=rl-n       # namespace of node I: rl-nI
readonly VETH_PREFIX=rlv-n    # bridge-side veth of node I: rlv-nI (node side: eth0)
readonly SSHD=/usr/sbin/sshd
readonly MAX_NODES=244        # 10 + N must stay below 255
READY_TIMEOUT=${RLC_READY_TIMEOUT:-20}

PROG=cluster.sh
# die, warn, now_ms, need_root, node_ip, record, alive, descendants, net_up, net_down
# shellcheck source=netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
WAIT_JOBS=()   # PIDs of readiness pollers running in the background

usage() {
    sed -n '/^# Usage:/,/^# Environment/p' "$0" | sed -e 's/^# \{0,1\}//' -e '/^Environment/d' >&2
    exit 2
}

check_tools() {
    local t missing=()
    for t in ip ssh ssh-keygen unshare setsid flock timeout ps hostname awk tac; do
        command -v "$t" >/dev/null 2>&1 || missing+=("$t")
    done
    [ -x "$SSHD" ] || missing+=("$SSHD")
    [ ${#missing[@]} -eq 0 ] ||
        die "missing tools: ${missing[*]} (install openssh-server openssh-client iproute2 util-linux coreutils procps)"
}

# Absolute path of DIR; rejects characters that would need quoting in ssh/sshd configs.
abs_dir() {
    local d=$1
    case $d in *[[:space:]\"\'\\%]*) die "DIR must not contain whitespace, quotes, '\\' or '%': $d" ;; esac
    (cd "$d" && pwd -P)
}

# Number of nodes of the cluster in DIR (from DIR/hosts).
cluster_size() {
    [ -f "$DIR/hosts" ] || die "$DIR/hosts not found: no cluster was brought up in $DIR"
    wc -l <"$DIR/hosts"
}

check_index() {
    local i=$1 n
    n=$(cluster_size)
    [[ $i =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$n" ] || die "node index must be 1..$n, got '$i'"
}

# --- processes -----------------------------------------------------------------------------
# True if PID is (still) one of our sshd wrappers for DIR: its command line names our config.
# Guards against killing an unrelated process that reused a recorded PID.
ours() {
    local pid=$1 cmd
    [ -r "/proc/$pid/cmdline" ] || return 1
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmd == *"$DIR/n"*"/sshd_config"* ]]
}

# Kill the given process-group leaders (our wrappers; setsid made PGID == PID) and the given
# plain PIDs: SIGTERM, wait up to ~3 s, then SIGKILL.
terminate() {
    local groups=$1 others=$2 p t
    for p in $groups; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
    for p in $others; do kill -TERM "$p" 2>/dev/null || true; done
    # Stopped processes (kill -STOP fault injection) act on SIGTERM only once continued.
    for p in $groups; do kill -CONT -- "-$p" 2>/dev/null || true; done
    for p in $others; do kill -CONT "$p" 2>/dev/null || true; done
    for t in $(seq 60); do
        local left=0
        for p in $groups $others; do alive "$p" && { left=1; break; }; done
        [ $left = 0 ] && return 0
        sleep 0.05
    done
    for p in $groups; do kill -KILL -- "-$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
    for p in $others; do kill -KILL "$p" 2>/dev/null || true; done
    for t in $(seq 40); do
        local left=0
        for p in $groups $others; do alive "$p" && { left=1; break; }; done
        [ $left = 0 ] && return 0
        sleep 0.05
    done
    warn "warning: some processes did not die: $(for p in $groups $others; do alive "$p" && echo -n "$p "; done)"
}

# Start node I's sshd in the background, record its PID. The chain setsid -> ip netns exec ->
# unshare -> sh -> sshd execs all the way down, so the recorded PID is sshd's (and the PGID/SID).
start_sshd() {
    local i=$1 n=n$1 pid
    rm -f "$DIR/$n/sshd.pid" "$DIR/$n/wrapper.pid"
    setsid ip netns exec "$NS_PREFIX$i" unshare --uts \
        sh -c 'hostname "$1" && exec "$2" -D -f "$3" -E "$4"' \
        sh "$n" "$SSHD" "$DIR/$n/sshd_config" "$DIR/$n/sshd.log" \
        </dev/null >>"$DIR/$n/sshd.log" 2>&1 9<&- &
    pid=$!
    echo "$pid" >>"$DIR/pids"
    echo "$pid" >"$DIR/$n/wrapper.pid"
}

# Wait (bounded by a deadline in ms) until node I's sshd accepts `ssh nI true`.
# Prints a diagnostic and returns 1 on failure.
wait_node() {
    local i=$1 deadline=$2 n=n$1 pid left
    pid=$(cat "$DIR/$n/wrapper.pid")
    while :; do
        if ! alive "$pid"; then
            echo "$PROG: node $n ($(node_ip "$i")): sshd exited during startup; $DIR/$n/sshd.log says:" >&2
            tail -n 5 "$DIR/$n/sshd.log" 2>/dev/null | sed 's/^/    /' >&2
            return 1
        fi
        left=$((deadline - $(now_ms)))
        if [ $left -le 0 ]; then
            echo "$PROG: node $n ($(node_ip "$i")): sshd did not accept connections within ${READY_TIMEOUT}s" >&2
            [ ! -s "$DIR/$n/ready.err" ] || sed 's/^/    ssh: /' "$DIR/$n/ready.err" >&2
            tail -n 5 "$DIR/$n/sshd.log" 2>/dev/null | sed 's/^/    sshd: /' >&2
            return 1
        fi
        # sshd writes its PidFile once it listens; only then spend an ssh on it.
        if [ -s "$DIR/$n/sshd.pid" ]; then
            local secs=$(((left + 999) / 1000))
            if timeout -k 1 "$secs" ssh -F "$DIR/ssh_config" "$n" true </dev/null >/dev/null 2>"$DIR/$n/ready.tmp" 9<&-; then
                rm -f "$DIR/$n/ready.err" "$DIR/$n/ready.tmp"
                return 0
            fi
            # Keep the last non-empty complaint for the failure report.
            if [ -s "$DIR/$n/ready.tmp" ]; then mv -f "$DIR/$n/ready.tmp" "$DIR/$n/ready.err"; fi
        fi
        sleep 0.05
    done
}

# Wait for the listed node indices in parallel; fail naming every node that did not come up.
wait_ready() {
    local deadline i rc=0
    deadline=$(($(now_ms) + READY_TIMEOUT * 1000))
    WAIT_JOBS=()
    for i in "$@"; do
        wait_node "$i" "$deadline" &
        WAIT_JOBS+=($!)
    done
    for i in "${WAIT_JOBS[@]}"; do wait "$i" || rc=1; done
    WAIT_JOBS=()
    return $rc
}

# --- up ------------------------------------------------------------------------------------

write_client_options() {
    cat <<EOF
Host *
    User root
    IdentityFile $DIR/client_key
    IdentitiesOnly yes
    BatchMode yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    CheckHostIP no
    UpdateHostKeys no
    LogLevel ERROR
    ConnectTimeout 5
    KexAlgorithms curve25519-sha256
EOF
}

up_cleanup() {
    local rc=$?
    if [ "${UP_DONE:-0}" != 1 ]; then
        # Interrupted while waiting: stop our pollers first (they would report the teardown).
        local j
        for j in "${WAIT_JOBS[@]}"; do kill -TERM "$j" 2>/dev/null || true; done
        if [ "${RLC_KEEP_ON_FAILURE:-0}" = 1 ]; then
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
    [ $# -eq 2 ] || usage
    local dir=$1 n=$2 i t0
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_NODES ] || die "N must be 1..$MAX_NODES, got '$n'"
    [[ $READY_TIMEOUT =~ ^[0-9]+$ ]] || die "RLC_READY_TIMEOUT must be whole seconds"
    need_root
    check_tools
    t0=$(now_ms)
    mkdir -p "$dir"
    DIR=$(abs_dir "$dir")
    [ ! -s "$DIR/created" ] || die "$DIR already holds a cluster; run: $0 down $DIR"

    # Refuse to touch anything that already exists (another cluster, a stale run, a real network).
    ip link show "$BRIDGE" >/dev/null 2>&1 && die "interface $BRIDGE already exists (stale cluster? run '$0 down' on its DIR, or 'ip link del $BRIDGE')"
    local route
    route=$(ip -4 route show to match "$HEAD_IP" | grep -v '^default' || true)
    [ -z "$route" ] || die "$NET.0/24 is already routed in the root namespace: ${route%%$'\n'*}"
    for ((i = 1; i <= n; i++)); do
        [ ! -e "/run/netns/$NS_PREFIX$i" ] || die "network namespace $NS_PREFIX$i already exists (stale cluster?)"
        ! ip link show "$VETH_PREFIX$i" >/dev/null 2>&1 || die "interface $VETH_PREFIX$i already exists (stale cluster?)"
        [ ! -e "/etc/netns/$NS_PREFIX$i" ] || die "/etc/netns/$NS_PREFIX$i already exists (stale cluster?)"
    done

    UP_DONE=0
    trap up_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    : >"$DIR/created"
    : >"$DIR/pids"
    rm -f "$DIR/hosts"

    # --- keys and configs (under DIR) ---
    umask 022
    rm -f "$DIR/client_key" "$DIR/client_key.pub"
    ssh-keygen -q -N '' -t ed25519 -C rlaunch-cluster-client -f "$DIR/client_key" </dev/null
    install -m 600 "$DIR/client_key.pub" "$DIR/authorized_keys"

    local head_names="head" hn
    for hn in "$(hostname -s 2>/dev/null || true)" "$(hostname 2>/dev/null || true)"; do
        # Map the head's own name to the bridge too (Hydra-style proxies dial it back).
        [[ -n $hn && $hn != localhost* && ! $hn =~ ^n[0-9]+$ && " $head_names " != *" $hn "* ]] && head_names+=" $hn"
    done
    local hosts_file="127.0.0.1 localhost
::1 localhost ip6-localhost ip6-loopback
$HEAD_IP $head_names"
    for ((i = 1; i <= n; i++)); do hosts_file+=$'\n'"$(node_ip "$i") n$i"; done

    {
        for ((i = 1; i <= n; i++)); do printf 'Host n%d\n    HostName %s\n' "$i" "$(node_ip "$i")"; done
        write_client_options
    } >"$DIR/ssh_config"

    for ((i = 1; i <= n; i++)); do
        local nd=$DIR/n$i ip
        ip=$(node_ip "$i")
        mkdir -p "$nd"
        rm -f "$nd/ssh_host_ed25519_key" "$nd/ssh_host_ed25519_key.pub" "$nd/sshd.log" "$nd/ready.err" "$nd/ready.tmp"
        ssh-keygen -q -N '' -t ed25519 -C "n$i" -f "$nd/ssh_host_ed25519_key" </dev/null
        cat >"$nd/sshd_config" <<EOF
# sshd of fake node n$i (generated by cluster.sh)
ListenAddress $ip
Port 22
AddressFamily inet
HostKey $nd/ssh_host_ed25519_key
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile $nd/sshd.pid
LogLevel ERROR
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
MaxStartups 100
MaxSessions 100
EOF
        # Seen as /etc/hosts and /etc/ssh/ssh_config inside the node (ip netns exec bind-mounts
        # /etc/netns/NS/* over /etc/*; the ssh directory replaces /etc/ssh as a whole).
        if [ ! -d /etc/netns ]; then record dir /etc/netns; mkdir -p /etc/netns; fi
        record dir "/etc/netns/$NS_PREFIX$i"
        mkdir -p "/etc/netns/$NS_PREFIX$i/ssh"
        printf '%s\n' "$hosts_file" >"/etc/netns/$NS_PREFIX$i/hosts"
        write_client_options >"/etc/netns/$NS_PREFIX$i/ssh/ssh_config"
    done
    if [ ! -d /run/sshd ]; then record dir /run/sshd; mkdir -p -m 0755 /run/sshd; fi

    # --- network ---
    [ -d /run/netns ] || record mnt /run/netns
    net_up "$n"

    # --- sshds ---
    for ((i = 1; i <= n; i++)); do start_sshd "$i"; done
    for ((i = 1; i <= n; i++)); do echo "n$i"; done >"$DIR/hosts"
    local -a idx=()
    for ((i = 1; i <= n; i++)); do idx+=("$i"); done
    wait_ready "${idx[@]}" || die "cluster did not come up"

    UP_DONE=1
    local ms=$(($(now_ms) - t0))
    warn "$n node(s) up in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s; ssh -F $DIR/ssh_config n1"
}

# --- down ----------------------------------------------------------------------------------

do_down() {
    set +e    # best effort from here on: remove whatever exists
    local created=$DIR/created p groups="" others="" kind name

    # 1. Processes: our sshd wrappers (process groups), their descendants (sessions, whatever
    #    tests started through them), and anything still living in our namespaces.
    local -a cand=()
    [ -f "$DIR/pids" ] && while read -r p _; do [[ $p =~ ^[0-9]+$ ]] && cand+=("$p"); done <"$DIR/pids"
    for p in "$DIR"/n*/wrapper.pid; do read -r p <"$p" 2>/dev/null && [[ $p =~ ^[0-9]+$ ]] && cand+=("$p"); done
    for p in "${cand[@]}"; do
        if alive "$p" && ours "$p" && [[ " $groups " != *" $p "* ]]; then groups+=" $p"; fi
    done
    if [ -n "$groups" ]; then
        # shellcheck disable=SC2086
        others=$(descendants $groups | tr '\n' ' ')
    fi
    if [ -f "$created" ]; then
        while read -r kind name; do
            [ "$kind" = netns ] && [ -e "/run/netns/$name" ] || continue
            others+=" $(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')"
        done <"$created"
    fi
    # Never ourselves or our ancestors.
    local self=" $$ $BASHPID $PPID "
    others=$(for p in $others; do [[ $self == *" $p "* || " $groups " == *" $p "* ]] || echo "$p"; done | sort -un | tr '\n' ' ')
    if [ -n "${groups// /}${others// /}" ]; then terminate "$groups" "$others"; fi

    # 2. Network and files, in the order: namespaces, links, directories, mounts.
    if [ -f "$created" ]; then
        net_down
        while read -r kind name; do
            [ "$kind" = dir ] || continue
            case $name in
                /etc/netns/"$NS_PREFIX"[0-9]*) rm -rf -- "$name" ;;
                /etc/netns | /run/sshd) rmdir -- "$name" 2>/dev/null || true ;;
            esac
        done < <(tac "$created")    # /etc/netns/rl-nI before /etc/netns
        while read -r kind name; do
            [ "$kind" = mnt ] && [ "$name" = /run/netns ] || continue
            # We made ip create /run/netns; remove it only if no namespace is left in it.
            if [ -d /run/netns ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
                umount /run/netns 2>/dev/null || true
                rmdir /run/netns 2>/dev/null || true
            fi
        done <"$created"
    fi
    rm -f "$DIR/created" "$DIR/pids" "$DIR"/n*/wrapper.pid "$DIR"/n*/sshd.pid
    return 0
}

cmd_down() {
    [ $# -eq 1 ] || usage
    need_root
    [ -d "$1" ] || return 0
    DIR=$(abs_dir "$1")
    do_down
}

# --- fault injection -----------------------------------------------------------------------

cmd_stop_sshd() {
    [ $# -eq 2 ] || usage
    need_root
    DIR=$(abs_dir "$1")
    check_index "$2"
    local n=n$2 pid=""
    [ -f "$DIR/$n/wrapper.pid" ] && read -r pid <"$DIR/$n/wrapper.pid"
    if [ -n "$pid" ] && alive "$pid" && ours "$pid"; then
        # Only the listener: established sessions survive, as with a real sshd restart.
        terminate "$pid" ""
    fi
    rm -f "$DIR/$n/wrapper.pid" "$DIR/$n/sshd.pid"
}

cmd_start_sshd() {
    [ $# -eq 2 ] || usage
    need_root
    check_tools
    DIR=$(abs_dir "$1")
    check_index "$2"
    [ -s "$DIR/created" ] || die "no cluster is up in $DIR"
    local n=n$2 pid=""
    [ -f "$DIR/$n/wrapper.pid" ] && read -r pid <"$DIR/$n/wrapper.pid"
    if [ -n "$pid" ] && alive "$pid" && ours "$pid"; then return 0; fi
    start_sshd "$2"
    wait_ready "$2" || die "sshd of $n did not come back"
}

cmd_link() {
    local state=$1
    shift
    [ $# -eq 2 ] || usage
    need_root
    DIR=$(abs_dir "$1")
    check_index "$2"
    ip link set "$VETH_PREFIX$2" "$state"
    # Forget the node's MAC everywhere, and everything the node learnt: going down, so that
    # connecting to it fails the same way each time (ARP fails: "No route to host" after ~3 s)
    # rather than depending on cached entries; coming up, so that no entry left FAILED while
    # it was down answers "No route to host" at once.
    local ip j n tries
    ip=$(node_ip "$2")
    n=$(cluster_size)
    ip neigh flush to "$ip" dev "$BRIDGE" 2>/dev/null || true
    for ((j = 1; j <= n; j++)); do
        [ "$j" = "$2" ] || ip -n "$NS_PREFIX$j" neigh flush to "$ip" 2>/dev/null || true
    done
    [ "$state" = up ] || return 0
    ip -n "$NS_PREFIX$2" neigh flush all 2>/dev/null || true
    # Back when its sshd accepts a connection from the head again.
    for ((tries = 0; tries < 50; tries++)); do
        if timeout 1 bash -c "exec 3<>/dev/tcp/$ip/22" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    die "node $2 ($ip) does not accept connections after its link came up"
}

main() {
    [ $# -ge 1 ] || usage
    local cmd=$1
    shift
    # One cluster operation at a time on this machine (bridge and namespace names are global):
    # a concurrent `up` then fails cleanly on the existence checks instead of racing. The lock is
    # taken on this script itself, so it leaves no file behind; fd 9 is closed for the daemons.
    if [ "$cmd" != help ] && [ "$cmd" != -h ] && [ "$cmd" != --help ] && command -v flock >/dev/null 2>&1; then
        exec 9<"${BASH_SOURCE[0]}"
        flock 9
    fi
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        stop-sshd) cmd_stop_sshd "$@" ;;
        start-sshd) cmd_start_sshd "$@" ;;
        link-down) cmd_link down "$@" ;;
        link-up) cmd_link up "$@" ;;
        -h | --help | help) usage ;;
        *) usage ;;
    esac
}

main "$@"
