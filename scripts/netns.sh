#!/usr/bin/env bash
# Hosts of our own on one machine, by hand: the same layout tests/hosts.rs makes (see
# tests/common/hosts.rs). Each host is a network namespace with its loopback up and one veth,
# eth0, joined to a bridge that lives in a namespace of its own (never the root namespace);
# host i has 198.18.0.(i+1)/24 and fd42:6e62::(i+1)/64. Nothing is routed out. Needs root.
#
#   scripts/netns.sh up N              make hosts 0..N-1 (fnbsh-h0 ...) and the bridge (fnbsh-br)
#   scripts/netns.sh run I NAME CMD... run CMD on host I with host name NAME (its own UTS namespace)
#   scripts/netns.sh link I down|up    pull host I's cable, or put it back
#   scripts/netns.sh down              delete every namespace this script made
#
# Example: two ranks of the bootstrap test, each on its own host (no NCCL_HOSTID needed):
#   scripts/netns.sh up 2
#   NCCL_COMM_ID=198.18.0.1:29500 scripts/netns.sh run 0 h0 ./my_rank 0 2 &
#   NCCL_COMM_ID=198.18.0.1:29500 scripts/netns.sh run 1 h1 ./my_rank 1 2
#   scripts/netns.sh down
set -euo pipefail

P=fnbsh
BR=$P-br

die() { echo "netns.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
command -v ip >/dev/null || die "needs ip (iproute2): bash scripts/setup-deps.sh"

case "${1:-}" in
  up)
    n="${2:?how many hosts}"
    ip netns add "$BR"
    ip -n "$BR" link add br0 type bridge
    ip -n "$BR" link set br0 up
    for ((i = 0; i < n; i++)); do
      h="$P-h$i"
      ip netns add "$h"
      ip -n "$h" link set lo up
      ip link add eth0 netns "$h" type veth peer name "h$i" netns "$BR"
      ip -n "$BR" link set "h$i" master br0 up
      ip -n "$h" addr add "198.18.0.$((i + 1))/24" dev eth0
      ip -n "$h" addr add "fd42:6e62::$((i + 1))/64" dev eth0 nodad
      ip -n "$h" link set eth0 up
      echo "host $i: namespace $h, eth0 198.18.0.$((i + 1)) fd42:6e62::$((i + 1))"
    done
    ;;
  run)
    i="${2:?host}"; name="${3:?host name}"; shift 3
    exec ip netns exec "$P-h$i" unshare -u sh -c 'echo "$0" > /proc/sys/kernel/hostname && exec "$@"' "$name" "$@"
    ;;
  link)
    ip -n "$BR" link set "h${2:?host}" "${3:?down or up}"
    ;;
  down)
    for ns in $(ip netns list | awk '{print $1}' | grep "^$P-" || true); do
      ip netns del "$ns"
    done
    ;;
  *)
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
