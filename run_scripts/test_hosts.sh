#!/usr/bin/env bash
# Test hosts on one machine: network namespaces, each with its own address, host name and sshd,
# so `horovodrun -H 10.250.0.11:1,10.250.0.12:1` and `mpirun --host ...` launch over ssh (root).
#
#   bash run_scripts/test_hosts.sh start [N]     # N hosts (default 2): h1 .. hN; idempotent
#   bash run_scripts/test_hosts.sh status        # one line per host; exit 0 only if all are up
#   bash run_scripts/test_hosts.sh down h2       # the host disappears: link down, its processes killed
#   bash run_scripts/test_hosts.sh up h2         # it comes back: link up, sshd started again
#   bash run_scripts/test_hosts.sh env           # shell lines: addresses, ssh config, PATH for the launcher
#   bash run_scripts/test_hosts.sh discover [S]  # ADDR:S for each host that is up (horovodrun
#                                                # --host-discovery-script; S slots, default 1)
#   bash run_scripts/test_hosts.sh stop          # everything removed (namespaces, bridge, work dir)
#
# Layout (the launcher stays in the root namespace, where pytest and horovodrun run):
#
#   root namespace: bridge hvdt0 10.250.0.1/24 --+-- veth hvdt-h1 <-> hvdt0 10.250.0.11 in hvdtrack-h1
#                                                +-- veth hvdt-h2 <-> hvdt0 10.250.0.12 in hvdtrack-h2
#
# The interface is called hvdt0 on every "host" and on the launcher, so one name selects it
# everywhere (horovodrun --network-interface hvdt0; Horovod also takes the driver's Gloo rendezvous
# address from the interface of that name). The namespaces have no other interface and no default
# route: their traffic cannot leave 10.250.0.0/24. Each sshd runs in its own UTS namespace too, so
# processes it starts see the host name hvdtrack-hN (socket.gethostname() tells the hosts apart).
#
# Names: inside the namespaces hvdtrack-h0 (the launcher, .1) and hvdtrack-hN resolve through
# /etc/netns/hvdtrack-hN/hosts (mounted over /etc/hosts by `ip netns exec`); the root namespace's
# /etc/hosts is not touched, so launchers there use the addresses.
#
# ssh: a key pair, host key, sshd_config, ssh_config and known_hosts live in the work dir; nothing
# in ~/.ssh or /etc/ssh is touched. Launchers reach them through $HVDTRACK_HOSTS_DIR/bin/ssh, a
# wrapper that runs `ssh -F $HVDTRACK_HOSTS_DIR/ssh_config`: put that bin/ first on PATH
# (horovodrun and mpirun call plain `ssh`), or give mpirun `--mca plm_rsh_agent <dir>/bin/ssh`.
#
# Environment:
#   HVDTRACK_HOSTS_DIR     work dir (default /tmp/hvdtrack-hosts)
#   HVDTRACK_HOSTS_NET     first three octets of the /24 (default 10.250.0)
#   HVDTRACK_HOSTS_WAIT_S  deadline for each wait (default 20)
#   HVDTRACK_HOSTS_SSH_ALIVE_S  the launcher's ssh ServerAliveInterval (default 0: off, as ssh's own
#                          default; read at start)
set -euo pipefail

work="${HVDTRACK_HOSTS_DIR:-/tmp/hvdtrack-hosts}"
net="${HVDTRACK_HOSTS_NET:-10.250.0}"
wait_s="${HVDTRACK_HOSTS_WAIT_S:-20}"
ssh_alive_s="${HVDTRACK_HOSTS_SSH_ALIVE_S:-0}"
bridge=hvdt0
ifname=hvdt0 # inside each namespace
prefix=hvdtrack-h
max_hosts=32 # names in each host's hosts file: hvdtrack-h1 .. hvdtrack-h32

say() { printf '[test_hosts] %s\n' "$*"; }
die() {
    printf '[test_hosts] ERROR: %s\n' "$1" >&2
    [ $# -gt 1 ] && printf '[test_hosts] what to do: %s\n' "$2" >&2
    exit 1
}
addr_of() { echo "$net.$((10 + ${1#h}))"; }
ns_of() { echo "$prefix${1#h}"; }
# Hosts that exist now, as h1 h2 ...
hosts() { ip netns list 2>/dev/null | sed -n "s/^$prefix\([0-9][0-9]*\).*/h\1/p" | sort -V; }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s until it succeeds or time runs out.
wait_for() {
    local seconds="$1" what="$2"
    shift 2
    local end=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$end" ] || return 1
        sleep 0.1
    done
}

preconditions() {
    [ "$(id -u)" = 0 ] || die "test hosts need root (network namespaces, sshd)" "run as root"
    command -v ip >/dev/null || die "no 'ip' command" "apt-get install iproute2"
    [ -x /usr/sbin/sshd ] || die "no /usr/sbin/sshd" "apt-get install openssh-server (run_scripts/install.sh does)"
    command -v unshare >/dev/null || die "no 'unshare' command" "apt-get install util-linux"
}

ssh_files() {
    mkdir -p "$work/bin"
    chmod 700 "$work"
    [ -f "$work/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C hvdtrack-test-hosts -f "$work/id_ed25519"
    [ -f "$work/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C hvdtrack-test-host -f "$work/host_ed25519"
    cp "$work/id_ed25519.pub" "$work/authorized_keys"
    # Every host shares one host key: known_hosts lists it for the whole subnet.
    printf '%s.* %s\n' "$net" "$(cut -d' ' -f1,2 "$work/host_ed25519.pub")" >"$work/known_hosts"
    cat >"$work/sshd_config" <<EOF
# sshd for hvdtrack's test hosts (run_scripts/test_hosts.sh); ListenAddress and PidFile per host.
HostKey $work/host_ed25519
AuthorizedKeysFile $work/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
# horovodrun opens several sessions per host at once (task services, ranks, elastic discovery).
MaxStartups 100:30:200
MaxSessions 100
ClientAliveInterval 5
ClientAliveCountMax 3
LogLevel ERROR
EOF
    cat >"$work/ssh_config" <<EOF
# ssh client settings for hvdtrack's test hosts (run_scripts/test_hosts.sh).
Host *
    User root
    IdentityFile $work/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $work/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 5
    # 0 (ssh's default): a host that disappears leaves its ssh session waiting; the job ends by
    # its own deadline. N > 0: the session ends ~3N s after the host went.
    ServerAliveInterval $ssh_alive_s
    ServerAliveCountMax 3
    LogLevel ERROR
EOF
    cat >"$work/bin/ssh" <<EOF
#!/bin/sh
# ssh with the test hosts' own config (run_scripts/test_hosts.sh); launchers find it on PATH.
exec /usr/bin/ssh -F "$work/ssh_config" "\$@"
EOF
    chmod 755 "$work/bin/ssh"
}

bridge_up() {
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        ip link add "$bridge" type bridge
    fi
    ip addr replace "$net.1/24" dev "$bridge"
    ip link set "$bridge" up
}

sshd_running() {
    local pidfile="$work/$1/sshd.pid"
    [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# host_up hN: namespace, veth pair on the bridge, address, sshd. Safe to repeat.
host_up() {
    local h="$1" ns addr veth
    ns="$(ns_of "$h")"
    addr="$(addr_of "$h")"
    veth="hvdt-$h"
    mkdir -p "$work/$h"
    hosts_file "$ns"
    ip netns list | grep -qx "$ns\( .*\)\?" || ip netns add "$ns"
    ip -n "$ns" link set lo up
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name "$ifname" netns "$ns"
    fi
    ip link set "$veth" master "$bridge"
    ip link set "$veth" up
    ip -n "$ns" addr replace "$addr/24" dev "$ifname"
    ip -n "$ns" link set "$ifname" up
    if ! sshd_running "$h"; then
        mkdir -p /run/sshd # sshd's privilege separation directory
        # Own UTS namespace: everything started over ssh sees the host name hvdtrack-hN.
        ip netns exec "$ns" unshare --uts sh -c \
            'hostname "$1"; exec /usr/sbin/sshd -f "$2" -o ListenAddress="$3" -o PidFile="$4" -E "$5"' \
            sh "$ns" "$work/sshd_config" "$addr" "$work/$h/sshd.pid" "$work/$h/sshd.log" ||
            die "sshd did not start in $ns" "read $work/$h/sshd.log"
    fi
    wait_for "$wait_s" "ssh to $h" ssh_ok "$addr" ||
        die "no ssh to $h ($addr) after $wait_s s" "read $work/$h/sshd.log; try: $work/bin/ssh $addr true"
}

# /etc/netns/NS/hosts is what `ip netns exec NS` mounts over /etc/hosts for what runs in NS (iproute2's
# own per-namespace config): there every host name resolves to its address on the link. Gloo needs
# that: Horovod 0.28.1 binds its process-set contexts to the address of gethostname(), whatever
# HOROVOD_GLOO_IFACE says. The machine's /etc/hosts is left alone.
hosts_file() {
    local i
    mkdir -p "/etc/netns/$1"
    {
        echo "# hvdtrack test hosts (run_scripts/test_hosts.sh); removed by its stop"
        echo "127.0.0.1 localhost"
        echo "$net.1 ${prefix}0"
        for i in $(seq 1 "$max_hosts"); do echo "$(addr_of "h$i") $prefix$i"; done
    } >"/etc/netns/$1/hosts"
}

ssh_ok() { "$work/bin/ssh" -o ConnectTimeout=2 "$1" true; }

# host_down hN: the host disappears as a crashed node would: silence on the link, nothing running.
host_down() {
    local h="$1" ns pids
    ns="$(ns_of "$h")"
    ip netns list | grep -qx "$ns\( .*\)\?" || die "no host $h (namespace $ns)" "start the hosts first"
    ip link set "hvdt-$h" down 2>/dev/null || true
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    wait_for "$wait_s" "processes of $h to end" no_pids "$ns" ||
        die "processes still running in $ns after $wait_s s: $(ip netns pids "$ns" | tr '\n' ' ')"
    rm -f "$work/$h/sshd.pid"
}

no_pids() { [ -z "$(ip netns pids "$1" 2>/dev/null)" ]; }

host_remove() {
    local h="$1" ns
    ns="$(ns_of "$h")"
    host_down "$h" 2>/dev/null || true
    ip link del "hvdt-$h" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
}

status() {
    local all_up=0 h ns addr link sshd reach
    [ -n "$(hosts)" ] || {
        say "no test hosts (bash run_scripts/test_hosts.sh start)"
        return 1
    }
    for h in $(hosts); do
        ns="$(ns_of "$h")"
        addr="$(addr_of "$h")"
        link="$(ip -br link show "hvdt-$h" 2>/dev/null | awk '{print $2}')"
        sshd=no
        sshd_running "$h" && sshd=yes
        reach=no
        ssh_ok "$addr" 2>/dev/null && reach=yes
        printf '%s %s namespace=%s link=%s sshd=%s ssh=%s\n' "$h" "$addr" "$ns" "${link:-none}" "$sshd" "$reach"
        [ "$reach" = yes ] || all_up=1
    done
    return "$all_up"
}

print_env() {
    local addrs=() h
    for h in $(hosts); do addrs+=("$(addr_of "$h")"); done
    echo "HVDTRACK_HOSTS_DIR=$work"
    echo "HVDTRACK_HOSTS_ADDRESSES='${addrs[*]}'"
    echo "HVDTRACK_HOSTS_LAUNCHER=$net.1"
    echo "HVDTRACK_HOSTS_INTERFACE=$ifname"
    echo "HVDTRACK_HOSTS_SUBNET=$net.0/24"
    echo "HVDTRACK_HOSTS_SSH_CONFIG=$work/ssh_config"
    echo "PATH=$work/bin:\$PATH"
}

# Hosts that are up (link up, sshd running) as ADDR:SLOTS lines; cheap enough to run every second.
discover() {
    local slots="$1" h
    for h in $(hosts); do
        [ "$(cat "/sys/class/net/hvdt-$h/operstate" 2>/dev/null)" = up ] && sshd_running "$h" &&
            echo "$(addr_of "$h"):$slots"
    done
    return 0
}

cmd="${1:-}"
case "$cmd" in
    start)
        preconditions
        n="${2:-2}"
        [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le "$max_hosts" ] || die "host count '$n' is not 1-$max_hosts"
        started=$SECONDS
        ssh_files
        bridge_up
        for i in $(seq 1 "$n"); do host_up "h$i"; done
        say "$n host(s) up in $((SECONDS - started)) s: $(for i in $(seq 1 "$n"); do printf '%s ' "$(addr_of "h$i")"; done)(launcher $net.1, interface $ifname, work dir $work)"
        ;;
    stop)
        preconditions
        for h in $(hosts); do host_remove "$h"; done
        ip link del "$bridge" 2>/dev/null || true
        rmdir /etc/netns 2>/dev/null || true # only if nothing else is in it
        rm -rf "$work"
        say "stopped"
        ;;
    status) status ;;
    down)
        preconditions
        [ -n "${2:-}" ] || die "which host? e.g. down h2"
        host_down "$2"
        say "$2 ($(addr_of "$2")) is down"
        ;;
    up)
        preconditions
        [ -n "${2:-}" ] || die "which host? e.g. up h2"
        ip netns list | grep -qx "$(ns_of "$2")\( .*\)\?" || die "no host $2" "start the hosts first"
        [ -f "$work/sshd_config" ] || die "no work dir $work" "start the hosts first"
        bridge_up
        host_up "$2"
        say "$2 ($(addr_of "$2")) is up"
        ;;
    env) print_env ;;
    discover) discover "${2:-1}" ;;
    *)
        sed -n '2,12p' "$0" >&2
        exit 2
        ;;
esac
