# netns.sh - what the fake clusters of the tests (cluster.sh: sshd; slurm.sh: Slurm) share:
# small helpers, and the network of nodes nI in namespaces joined to a bridge. Sourced by
# both; the caller sets PROG, DIR, BRIDGE, NET, HEAD_IP, NS_PREFIX and VETH_PREFIX, and
# records in $DIR/created what it makes, so that its `down` can undo exactly that.

die() { echo "$PROG: error: $*" >&2; exit 1; }
warn() { echo "$PROG: $*" >&2; }

now_ms() { local t=${EPOCHREALTIME/./}; echo $((10#$t / 1000)); }

need_root() { [ "$(id -u)" = 0 ] || die "must run as root"; }

node_ip() { echo "$NET.$((10 + $1))"; }

record() { echo "$1 $2" >>"$DIR/created"; }

# True if PID exists and is not a zombie.
alive() {
    local st
    [ -r "/proc/$1/stat" ] || return 1
    st=$(cut -d')' -f2 "/proc/$1/stat" 2>/dev/null | awk '{print $1}') || return 1
    [ -n "$st" ] && [ "$st" != Z ]
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

# Brings up the bridge (HEAD_IP) and nodes 1..$1: a namespace each, joined by a veth whose
# node side is eth0 with the node's address.
net_up() {
    local n=$1 i
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
}

# Removes the namespaces and links recorded in $DIR/created (veths before the bridge).
net_down() {
    local created=$DIR/created kind name
    [ -f "$created" ] || return 0
    while read -r kind name; do
        [ "$kind" = netns ] || continue
        ip netns del "$name" 2>/dev/null || true
    done <"$created"
    while read -r kind name; do
        [ "$kind" = link ] || continue
        ip link del "$name" 2>/dev/null || true
    done < <(tac "$created")    # veths before the bridge
}
