#!/usr/bin/env bash
# Real-peer interop test: the Linux kernel's iSCSI initiator (open-iscsi's
# iscsid/iscsiadm with iscsi_tcp, Debian's stock kernel under QEMU TCG; see
# kernel-peer/README.md) against ironwire's iSCSI target on 127.0.0.1.
#
# Starts "$IRONWIRE_BIN" serve --config <generated TOML> --ctl-socket <work>
# on a free 127.0.0.1 port, runs the checks below one by one with
# `kernel-peer run` (the guest reaches the port as 10.0.2.2:PORT), prints a
# PASS/FAIL table, stops the daemon by PID, exits non-zero if any check
# failed.  Builds nothing: run `cargo build --release -p ironwire` first (or
# set IRONWIRE_BIN).
#
# Usage: tests/interop/iscsi-kernel.sh [options]
#   --port P            target port on 127.0.0.1 (default: a free port)
#   --only a,b / --skip a,b   run only / skip these checks (names below)
#   --show fail|always|never  guest console output (default fail)
#   --no-install        do not apt-get anything
#   --list              list the checks and exit
#
# Env: IRONWIRE_BIN (default <repo>/target/release/ironwire), KP_CACHE
# (default /tmp/kernel-peer-cache), IW_READY_TIMEOUT (s, default 20),
# IW_WORK_PARENT (default /var/tmp), IW_KEEP_WORK=1, RUST_LOG (default info).
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KP=$HERE/kernel-peer/kernel-peer
TOOL=iscsi-kernel
# shellcheck source=tests/interop/common.sh
. "$HERE/common.sh"
export KP_CACHE=${KP_CACHE:-/tmp/kernel-peer-cache}
export KP_SIW=${KP_SIW:-0}

IRONWIRE_BIN=${IRONWIRE_BIN:-$REPO/target/release/ironwire}
IQN_PLAIN=iqn.2026-11.io.ironwire:plain
IQN_CHAP=iqn.2026-11.io.ironwire:chap
IQN_MUTUAL=iqn.2026-11.io.ironwire:mutual
IQN_ACL=iqn.2026-11.io.ironwire:acl
IQN_READONLY=iqn.2026-11.io.ironwire:readonly
CHAP_USER=iwuser CHAP_SECRET=iwsecret123456
MCHAP_USER=iwuser2 MCHAP_SECRET=iwsecret654321
MTGT_USER=iwtarget MTGT_SECRET=iwtargetsecret99
ALLOWED_INITIATOR=iqn.2024-01.org.kernel-peer:allowed
DEFAULT_INITIATOR=iqn.2024-01.org.kernel-peer:initiator # the guest's default name

PORT="" ONLY="" SKIP="" SHOW=fail INSTALL=1

CHECKS=(discover-battery digest-battery chap-file4k mutual-chap pattern-64m ext4-fs acl-refused acl-allowed read-only restart-fio lun-grow)
describe() {
	case $1 in
	discover-battery) echo "SendTargets (acl target absent), login, battery, logout leaves nothing (ram, 512 B)" ;;
	digest-battery) echo "same with CRC32C header+data digests" ;;
	chap-file4k) echo "CHAP: wrong secret and no CHAP refused, right secret: battery (file, 4K)" ;;
	mutual-chap) echo "mutual CHAP: wrong target secret/name fails login, right one: battery" ;;
	pattern-64m) echo "64 MiB O_DIRECT pattern write / read back" ;;
	ext4-fs) echo "mkfs.ext4, 20 files, fsck, remount, sha256sums (file, 4K, CHAP)" ;;
	acl-refused) echo "not-allowed initiator: not listed, login refused (authorization failure); allowed iface logs in" ;;
	acl-allowed) echo "as the allowed initiator: acl target listed, login, battery, logout" ;;
	restart-fio) echo "fio verify on the file LU while ironwire drops the connection, restarts (SIGTERM) and is killed (SIGKILL); the session recovers (file, 4K, CHAP)" ;;
	read-only) echo "a read_only file device: sd sees Write Protect and marks the disk read-only, its data read, a write refused, the file unchanged" ;;
	lun-grow) echo "ironwire ctl grows the file LU under a logged-in session: CAPACITY DATA HAS CHANGED, a rescan takes the new size, I/O at the new end (file, 4K, CHAP)" ;;
	esac
}


usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit "${1:-0}"; }

while (($#)); do
	case $1 in
	--port) PORT=$2; shift 2 ;;
	--only) ONLY=$2; shift 2 ;;
	--skip) SKIP=$2; shift 2 ;;
	--show) SHOW=$2; shift 2 ;;
	--no-install) INSTALL=0; shift ;;
	--list) for c in "${CHECKS[@]}"; do printf '%-18s %s\n' "$c" "$(describe "$c")"; done; exit 0 ;;
	-h|--help) usage 0 ;;
	*) echo "iscsi-kernel: unknown argument $1 (try --help)" >&2; exit 2 ;;
	esac
done
PORT=${PORT:-$(free_port)}
[[ $PORT =~ ^[0-9]+$ ]] || { echo "iscsi-kernel: bad port $PORT" >&2; exit 2; }
IW_READY_TIMEOUT=${IW_READY_TIMEOUT:-20}
PORTAL=10.0.2.2:$PORT




# ------------------------------------------------------------------ target
WORK=$(mktemp -d "${IW_WORK_PARENT:-/var/tmp}/ironwire-iscsi-interop.XXXXXX")
DAEMON_PID="" DAEMON_LOG=$WORK/ironwire.log RESULTS=() FAILED=0 TARGET_PIDS=()

stop_daemon() { # the process group we started with setsid, by its id
	local p=$DAEMON_PID i
	[[ -n $p ]] || return 0
	if kill -0 "$p" 2>/dev/null; then
		kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
		for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "$p" 2>/dev/null; then kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; fi
	fi
	wait "$p" 2>/dev/null
	DAEMON_PID=""
	return 0
}
cleanup() {
	local rc=$?
	stop_guest
	stop_daemon
	if [[ ${IW_KEEP_WORK:-0} == 1 || $FAILED != 0 || $rc != 0 ]]; then
		echo "iscsi-kernel: logs kept in $WORK" >&2
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP


write_config() { # FILE
	mkdir -p "$WORK/img"
	truncate -s 256M "$WORK/img/file0.img"
	make_golden
	cat >"$1" <<TOML
# generated by tests/interop/iscsi-kernel.sh
[[device]]
name = "ram0"
kind = "ram"
size = "256MiB"
block_size = 512

[[device]]
name = "file0"
kind = "file"
path = "$WORK/img/file0.img"
size = "256MiB"
block_size = 4096

[[device]]
name = "ram1"
kind = "ram"
size = "64MiB"
block_size = 512

[[device]]
name = "ram2"
kind = "ram"
size = "64MiB"
block_size = 512

[[iscsi_target]]
iqn = "$IQN_PLAIN"
allow_any_initiator = true
[[iscsi_target.lun]]
lun = 0
device = "ram0"

[[iscsi_target]]
iqn = "$IQN_CHAP"
allow_any_initiator = true
chap = { user = "$CHAP_USER", secret = "$CHAP_SECRET" }
[[iscsi_target.lun]]
lun = 0
device = "file0"

[[iscsi_target]]
iqn = "$IQN_MUTUAL"
allow_any_initiator = true
chap = { user = "$MCHAP_USER", secret = "$MCHAP_SECRET" }
mutual_chap = { user = "$MTGT_USER", secret = "$MTGT_SECRET" }
[[iscsi_target.lun]]
lun = 0
device = "ram1"

[[iscsi_target]]
iqn = "$IQN_ACL"
allow_any_initiator = false
initiators = ["$ALLOWED_INITIATOR"]
[[iscsi_target.lun]]
lun = 0
device = "ram2"

$(golden_device_toml)

[[iscsi_target]]
iqn = "$IQN_READONLY"
allow_any_initiator = true
[[iscsi_target.lun]]
lun = 0
device = "golden"

[[port]]
transport = "iscsi"
address = "127.0.0.1:$PORT"

[control]
allow_paths = ["$WORK/img/"]
TOML
}

start_daemon() {
	[[ -x $IRONWIRE_BIN ]] || die "no ironwire binary at $IRONWIRE_BIN (cargo build --release -p ironwire, or set IRONWIRE_BIN)"
	port_open "$PORT" && die "something already listens on 127.0.0.1:$PORT"
	write_config "$WORK/ironwire.toml"
	start_ironwire "$DAEMON_LOG"
}

# start_ironwire LOG : the daemon in its own session (DAEMON_PID, and last
# in TARGET_PIDS for check_restart); ready when it printed `ready:` and the
# port accepts connections.
start_ironwire() {
	DAEMON_LOG=$1
	local cmd=("$IRONWIRE_BIN" serve --config "$WORK/ironwire.toml" --ctl-socket "$WORK/ctl.sock")
	say "starting ironwire: ${cmd[*]}"
	RUST_LOG=${RUST_LOG:-info} setsid "${cmd[@]}" >"$DAEMON_LOG" 2>&1 </dev/null &
	DAEMON_PID=$!
	TARGET_PIDS+=("$DAEMON_PID")
	local t0 deadline; t0=$(now); deadline=$(( $(date +%s) + IW_READY_TIMEOUT ))
	while (( $(date +%s) < deadline )); do
		kill -0 "$DAEMON_PID" 2>/dev/null || { echo "iscsi-kernel: ironwire exited before it was ready" >&2; return 1; }
		if grep -q '^ready:' "$DAEMON_LOG" && port_open "$PORT"; then
			say "ironwire (pid $DAEMON_PID) ready on 127.0.0.1:$PORT after $(since "$t0")s: $(grep -m1 '^ready:' "$DAEMON_LOG")"
			return 0
		fi
		sleep 0.2
	done
	echo "iscsi-kernel: ironwire not ready on 127.0.0.1:$PORT after ${IW_READY_TIMEOUT}s" >&2
	return 1
}

dump_daemon_log() { # every daemon's, restart-fio's earlier ones included
	local f
	for f in "$WORK"/ironwire*.log; do
		[[ -f $f ]] || continue
		printf '\n----- ironwire log (%s, last 200 lines) -----\n' "$f" >&2
		tail -n 200 "$f" >&2
	done
}



# check NAME TIMEOUT kernel-peer-run-args... : one guest boot, one scenario
check() {
	local name=$1 limit=$2; shift 2
	selected "$name" || return 0
	if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
		say "$name: SKIPPED, ironwire has exited"
		record "$name" 1 0; return 0
	fi
	say "$name: $(describe "$name")"
	echo "+ kernel-peer run -t $limit $*" >&2
	local t0 rc=0; t0=$(now)
	kp_run "$WORK/$name.console.log" "$limit" "$@" || rc=$?
	record "$name" "$rc" "$(since "$t0")"
	say "$name: $( ((rc == 0)) && echo PASS || echo "FAIL (rc=$rc, console: $WORK/$name.console.log)")"
}

run_checks() {
	local chap=(-e ISCSI_CHAP_USER="$CHAP_USER" -e ISCSI_CHAP_PASS="$CHAP_SECRET")
	check discover-battery 150 -e ISCSI_EXPECT_TARGETS="$IQN_PLAIN $IQN_CHAP $IQN_MUTUAL" \
		-e ISCSI_ABSENT_TARGETS="$IQN_ACL" -e ISCSI_EXPECT_LBS=512 iscsi-battery "$PORTAL" "$IQN_PLAIN"
	check digest-battery 150 -e ISCSI_DIGEST=1 -e ISCSI_ABSENT_TARGETS="$IQN_ACL" iscsi-battery "$PORTAL" "$IQN_PLAIN"
	check chap-file4k 150 "${chap[@]}" iscsi-chap "$PORTAL" "$IQN_CHAP"
	check mutual-chap 150 -e ISCSI_CHAP_USER="$MCHAP_USER" -e ISCSI_CHAP_PASS="$MCHAP_SECRET" \
		-e ISCSI_MUTUAL_USER="$MTGT_USER" -e ISCSI_MUTUAL_PASS="$MTGT_SECRET" iscsi-mutual "$PORTAL" "$IQN_MUTUAL"
	if selected pattern-64m; then
		head -c 64M /dev/urandom >"$WORK/pattern.bin"
		local sum; sum=$(sha256sum <"$WORK/pattern.bin" | cut -d' ' -f1)
		check pattern-64m 180 -f "$WORK/pattern.bin:/kp/files/pattern.bin" \
			-e PATTERN_FILE=/kp/files/pattern.bin -e PATTERN_SHA256="$sum" -e PATTERN_MIB=64 \
			iscsi-pattern "$PORTAL" "$IQN_PLAIN"
		rm -f "$WORK/pattern.bin"
	fi
	check ext4-fs 180 "${chap[@]}" -e FS_FILES=20 -e FS_MAX_KIB=4096 iscsi-fs "$PORTAL" "$IQN_CHAP"
	check acl-refused 120 -e KP_ISCSI_INITIATOR="$DEFAULT_INITIATOR" -e ALLOWED_INITIATOR="$ALLOWED_INITIATOR" \
		iscsi-refused "$PORTAL" "$IQN_ACL"
	check acl-allowed 150 -e KP_ISCSI_INITIATOR="$ALLOWED_INITIATOR" -e ISCSI_EXPECT_TARGETS="$IQN_ACL $IQN_PLAIN" \
		iscsi-battery "$PORTAL" "$IQN_ACL"
	check_read_only iscsi-readonly "$PORTAL" "$IQN_READONLY"
	check_restart restart-fio 300 "${chap[@]}" iscsi-restart "$PORTAL" "$IQN_CHAP"
	# Last: it leaves file0 larger than the configuration says.
	ON_MARKER=grow_event MARKERS=GROW check lun-grow 150 "${chap[@]}" -e GROW_MIB="$GROW_TO_MIB" iscsi-grow "$PORTAL" "$IQN_CHAP"
}

# grow_event GROW : when the guest says so, the runner grows file0 (the CHAP
# target's LU) from 256 MiB to GROW_TO_MIB with `ironwire ctl`.
GROW_TO_MIB=320
grow_event() {
	[[ $1 == GROW ]] || { say "unexpected marker KP-$1-NOW"; return 1; }
	"$IRONWIRE_BIN" ctl --socket "$WORK/ctl.sock" set device name=file0 size="${GROW_TO_MIB}MiB" ||
		{ say "ctl set device name=file0 size=${GROW_TO_MIB}MiB failed"; return 1; }
}

# ------------------------------------------------------------------ main
T0=$(now)
cd "$REPO" || die "no repo at $REPO"
ensure_host_tools
if ! start_daemon; then
	dump_daemon_log
	FAILED=1
	exit 1
fi
run_checks
kill -0 "$DAEMON_PID" 2>/dev/null || { echo "iscsi-kernel: ironwire exited during the run" >&2; FAILED=1; }
((FAILED)) && dump_daemon_log

printf '\n===== iSCSI kernel-initiator interop (%s, 127.0.0.1:%s) =====\n' "$IRONWIRE_BIN" "$PORT"
printf '%-18s %-17s %8s  %s\n' CHECK RESULT TIME WHAT
for r in "${RESULTS[@]}"; do echo "$r"; done
printf 'total wall %ss\n' "$(since "$T0")"
((${#RESULTS[@]})) || { echo "iscsi-kernel: no check selected" >&2; exit 1; }
exit "$FAILED"
