#!/usr/bin/env bash
# Real-peer interop test: the Linux kernel's NVMe/TCP host (Debian's stock
# kernel under QEMU TCG; see kernel-peer/README.md) against ironwire
# gateways in front of a real Ceph cluster (ceph-peer: one mon, one
# memstore OSD, on 127.0.0.1). Two parts:
#
#   battery     nvme-kernel.sh's device checks (discovery, the data
#               battery with flush, deallocate and write zeroes, the 4K-LBA
#               restricted subsystem, the 64 MiB pattern, ext4) against one
#               gateway whose namespaces are rbd images (512-byte and 4 KiB
#               LBAs).
#   multipath   two gateways export one image (layering only, as
#               docs/ceph.md recommends) under one NQN with disjoint
#               controller IDs; the kernel's native multipath must show one
#               namespace with two paths; gateway A is killed with SIGKILL
#               while fio writes with crc32c verification, and fio's run,
#               including its verify pass through the survivor, must be
#               clean.
#
# Builds nothing: run `cargo build --release` first (or set IRONWIRE_BIN).
#
# Usage: tests/interop/nvme-rbd.sh [--only battery,multipath] [--show fail|always|never] [--no-install]
# Env: IRONWIRE_BIN, KP_CACHE (default /tmp/kernel-peer-cache), CEPH_PEER
# (default tests/interop/ceph-peer/ceph-peer), IW_WORK_PARENT (default
# /var/tmp), IW_KEEP_WORK=1, RUST_LOG (default info), MP_FIO_SIZE.
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KP=$HERE/kernel-peer/kernel-peer
TOOL=nvme-rbd
# shellcheck source=tests/interop/common.sh
. "$HERE/common.sh"
export KP_CACHE=${KP_CACHE:-/tmp/kernel-peer-cache}
export KP_SIW=${KP_SIW:-0}
IRONWIRE_BIN=${IRONWIRE_BIN:-$REPO/target/release/ironwire}
CEPH_PEER=${CEPH_PEER:-$HERE/ceph-peer/ceph-peer}
MP_NQN=nqn.2026-11.io.ironwire:rbd-multipath
IW_READY_TIMEOUT=${IW_READY_TIMEOUT:-30}

ONLY="" SKIP="" SHOW=fail INSTALL=1
describe() {
	case $1 in
	battery) echo "nvme-kernel.sh's device checks against a gateway whose namespaces are rbd images" ;;
	multipath) echo "two gateways, one image: one namespace, two paths; gateway A SIGKILLed during fio verify" ;;
	esac
}
usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit "${1:-0}"; }
while (($#)); do
	case $1 in
	--only) ONLY=$2; shift 2 ;;
	--skip) SKIP=$2; shift 2 ;;
	--show) SHOW=$2; shift 2 ;;
	--no-install) INSTALL=0; shift ;;
	-h|--help) usage 0 ;;
	*) echo "nvme-rbd: unknown argument $1 (try --help)" >&2; exit 2 ;;
	esac
done

WORK=$(mktemp -d "${IW_WORK_PARENT:-/var/tmp}/ironwire-rbd.XXXXXX")
CEPH_DIR=$WORK/ceph
TARGET_PIDS=() TARGET_LOGS=() RESULTS=() FAILED=0
cleanup() {
	local rc=$? p
	stop_guest
	for p in "${TARGET_PIDS[@]}"; do stop_pid "$p"; done
	"$CEPH_PEER" destroy "$CEPH_DIR" >/dev/null 2>&1
	if [[ ${IW_KEEP_WORK:-0} == 1 || $FAILED != 0 || $rc != 0 ]]; then
		echo "nvme-rbd: logs kept in $WORK" >&2
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

rbd_create() { # NAME SIZE
	timeout 60 rbd -c "$CEPH_DIR/ceph.conf" create --size "$2" --image-feature layering "rbd/$1" ||
		die "rbd create $1 failed"
}

rbd_device() { # NAME IMAGE BLOCK_SIZE
	cat <<EOF
[[device]]
name = "$1"
kind = "rbd"
pool = "rbd"
image = "$2"
ceph_conf = "$CEPH_DIR/ceph.conf"
block_size = $3
connect_timeout = 20

EOF
}

# The battery: nvme-kernel.sh runs its checks against a target command of
# ours, an ironwire whose two subsystems are rbd images.
part_battery() {
	selected battery || return 0
	say "battery: $(describe battery)"
	local port t0 rc=0; port=$(free_port); t0=$(now)
	rbd_create bat512 256M
	rbd_create bat4k 128M
	{
		rbd_device ceph512 bat512 512
		rbd_device ceph4k bat4k 4096
		cat <<EOF
[[subsystem]]
nqn = "nqn.2026-11.io.ironwire:interop"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
device = "ceph512"

[[subsystem]]
nqn = "nqn.2026-11.io.ironwire:restricted"
allow_any_host = false
hosts = ["nqn.2014-08.org.nvmexpress:uuid:allowed-host"]
[[subsystem.namespace]]
nsid = 1
device = "ceph4k"

[[port]]
transport = "tcp"
address = "127.0.0.1:$port"
EOF
	} >"$WORK/battery.toml"
	# Digests, two queues and the refused host exercise the transport, not
	# the device, and nvme-kernel.sh runs them on its own target already.
	IW_WORK_PARENT=$WORK "$HERE/nvme-kernel.sh" --port "$port" --show "$SHOW" --no-install \
		--skip digest-battery,queues2-smp2,refused-host \
		--target-cmd "exec '$IRONWIRE_BIN' serve --config '$WORK/battery.toml' --ctl-socket '$WORK/battery.sock'" ||
		rc=$?
	record battery "$rc" "$(since "$t0")"
	say "battery: $( ((rc == 0)) && echo PASS || echo "FAIL (rc=$rc)")"
}

gateway_config() { # PORT MIN_CNTLID MAX_CNTLID DEVICE_NAME
	rbd_device "$4" mp 512
	cat <<EOF
[[subsystem]]
nqn = "$MP_NQN"
allow_any_host = true
min_cntlid = $2
max_cntlid = $3
[[subsystem.namespace]]
nsid = 1
device = "$4"

[[port]]
transport = "tcp"
address = "127.0.0.1:$1"
EOF
}

# mp_event MP-KILL : the guest says when to kill gateway A (MP_GW_A).
MP_GW_A=""
mp_event() {
	[[ $1 == MP-KILL && -n $MP_GW_A ]] || { say "unexpected marker KP-$1-NOW"; return 1; }
	say "multipath: killing gateway A (pid $MP_GW_A) with SIGKILL"
	kill -KILL -- "-$MP_GW_A" 2>/dev/null || kill -KILL "$MP_GW_A"
}

# Two gateways on one image; the guest says when to kill gateway A.
part_multipath() {
	selected multipath || return 0
	say "multipath: $(describe multipath)"
	local pa pb t0 rc=0 log=$WORK/multipath.console.log
	pa=$(free_port); pb=$(free_port); t0=$(now)
	rbd_create mp 256M
	gateway_config "$pa" 1 999 gw-a-vol >"$WORK/gw-a.toml"
	gateway_config "$pb" 1000 1999 gw-b-vol >"$WORK/gw-b.toml"
	RUST_LOG=${RUST_LOG:-info} start_target gw-a "$WORK/gw-a.log" \
		"$IRONWIRE_BIN" serve --config "$WORK/gw-a.toml" --ctl-socket "$WORK/gw-a.sock"
	local gw_a=${TARGET_PIDS[-1]}
	MP_GW_A=$gw_a
	RUST_LOG=${RUST_LOG:-info} start_target gw-b "$WORK/gw-b.log" \
		"$IRONWIRE_BIN" serve --config "$WORK/gw-b.toml" --ctl-socket "$WORK/gw-b.sock"
	local gw_b=${TARGET_PIDS[-1]}
	if ! wait_ready "$gw_a" "$pa" || ! wait_ready "$gw_b" "$pb"; then
		dump_target_logs
		record multipath 1 "$(since "$t0")"
		return 0
	fi
	KP_WITH_FIO=1 ON_MARKER=mp_event MARKERS=MP-KILL kp_run "$log" 300 \
		${MP_FIO_SIZE:+-e MP_FIO_SIZE="$MP_FIO_SIZE"} nvme-multipath "$pa" "$pb" "$MP_NQN" || rc=$?
	kill -0 "$gw_b" 2>/dev/null || { say "multipath: gateway B exited"; rc=1; }
	((rc == 0)) || dump_target_logs
	record multipath "$rc" "$(since "$t0")"
	say "multipath: $( ((rc == 0)) && echo PASS || echo "FAIL (rc=$rc, console: $log)")"
}

# ------------------------------------------------------------------ main
T0=$(now)
cd "$REPO" || die "no repo at $REPO"
[[ -x $IRONWIRE_BIN ]] || die "no ironwire binary at $IRONWIRE_BIN (cargo build --release, or set IRONWIRE_BIN)"
[[ -x $CEPH_PEER ]] || die "no ceph-peer at $CEPH_PEER"
ensure_host_tools
ensure_fio_layer || die "fio is not installed and --no-install given"
say "ceph-peer start $CEPH_DIR"
"$CEPH_PEER" start "$CEPH_DIR" >"$WORK/ceph-peer.env" 2>"$WORK/ceph-peer.log" || { tail -n 30 "$WORK/ceph-peer.log" >&2; die "ceph-peer start failed"; }
part_battery
part_multipath

printf '\n===== NVMe/TCP kernel host on rbd (%s) =====\n' "$IRONWIRE_BIN"
printf '%-18s %-17s %8s  %s\n' CHECK RESULT TIME WHAT
for r in "${RESULTS[@]}"; do echo "$r"; done
printf 'total wall %ss\n' "$(since "$T0")"
((${#RESULTS[@]})) || { echo "nvme-rbd: no check selected" >&2; exit 1; }
exit "$FAILED"
