#!/bin/sh
# The Debian packages `make test` and `make demo` need beyond Python's own: installed when missing (as root),
# else named, with a non-zero exit. Quick and silent when everything is there.
#   fusermount3, libfuse3.so.3: powerfs, the FUSE file system of the power-loss chaos faults (chaos/powerfs.py)
#   haproxy: the group's front (`raftmq cluster up --front`, cli/front.py) and the stock-client failover test
#   node, npm: the stock RocketMQ 5.x Node.js SDK of the gRPC interop tests (tests/interop/sdk5_nodejs.py)
# With the argument `bench` (make bench), also what the benchmarks measure raftmq against:
#   nats-server: NATS JetStream, bench/broker_bench.py's reference (it skips NATS without it)
# One line per need: the command or library that shows it is there, then the package that brings it.
set -eu

missing=""
need() {  # need KIND NAME PACKAGE: KIND is "command" or "library"
    case "$1" in
        command) command -v "$2" >/dev/null 2>&1 && return 0 ;;
        library) ldconfig -p 2>/dev/null | grep -q "$2" && return 0 ;;
    esac
    case " $missing " in *" $3 "*) ;; *) missing="$missing $3" ;; esac
}

need command fusermount3 fuse3
need library libfuse3.so.3 libfuse3-3
need command haproxy haproxy
need command node nodejs
need command npm npm
if [ "${1:-}" = bench ]; then
    need command nats-server nats-server
fi

[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "system packages missing:$missing" >&2
    echo "install them as root:  apt-get update && apt-get install -y$missing" >&2
    exit 1
fi
echo "installing system packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq $missing >/dev/null
