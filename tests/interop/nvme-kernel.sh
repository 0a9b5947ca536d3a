#!/usr/bin/env bash
# Real-peer interop test: the Linux kernel's NVMe/TCP host (Debian's stock
# kernel under QEMU TCG, nvme-cli in the guest; see kernel-peer/README.md)
# against an NVMe/TCP target on 127.0.0.1.
#
# Default: start "$IRONWIRE_BIN" serve --config <generated TOML> on 127.0.0.1,
# run the checks below one by one with `kernel-peer run`, print a PASS/FAIL
# table, stop the daemon, exit non-zero if any check failed.  Builds nothing:
# run `cargo build --release` first (or set IRONWIRE_BIN).
#
# Usage: tests/interop/nvme-kernel.sh [options]
#   --port P            target port on 127.0.0.1 (default: a free port; nvmet: 14420)
#   --target ironwire   (default) start $IRONWIRE_BIN with a generated config
#   --target nvmet      self-test of these scripts: the kernel's own nvmet in two
#                       target guests (P: ram-like, any host; P+1: 4K-LBA,
#                       restricted to the allowed host NQN), same NQNs as ironwire
#   --target-cmd CMD    start CMD (bash -c; $IW_PORT, $IW_READY_FILE exported)
#                       instead of ironwire; it must serve IW_NQN (any host) and
#                       IW_RESTRICTED_NQN (allowed host only) on the port
#   --ready-file F      with --target-cmd: also wait until F is non-empty
#   --only a,b / --skip a,b   run only / skip these checks (names below)
#   --show fail|always|never  guest console output (default fail)
#   --no-install        do not apt-get anything
#   --list              list the checks and exit
#
# Env: IRONWIRE_BIN (default <repo>/target/release/ironwire), KP_CACHE
# (default /tmp/kernel-peer-cache), IW_NQN, IW_RESTRICTED_NQN,
# IW_RESTRICTED_PORT, IW_ALLOWED_HOSTNQN, IW_REFUSED_HOSTNQN,
# IW_READY_TIMEOUT (s, default 20; nvmet 90), IW_TARGET_CMD, IW_WORK_PARENT
# (default /var/tmp), IW_KEEP_WORK=1, RUST_LOG (default info),
# IW_BENCH_TIME (seconds of each initiator-nvmet run, default 4).
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KP=$HERE/kernel-peer/kernel-peer
TOOL=nvme-kernel
# shellcheck source=tests/interop/common.sh
. "$HERE/common.sh"
export KP_CACHE=${KP_CACHE:-/tmp/kernel-peer-cache}
export KP_SIW=${KP_SIW:-0}

IRONWIRE_BIN=${IRONWIRE_BIN:-$REPO/target/release/ironwire}
IW_NQN=${IW_NQN:-nqn.2026-11.io.ironwire:interop}
IW_RESTRICTED_NQN=${IW_RESTRICTED_NQN:-nqn.2026-11.io.ironwire:restricted}
IW_READONLY_NQN=${IW_READONLY_NQN:-nqn.2026-11.io.ironwire:readonly}
IW_ALLOWED_HOSTNQN=${IW_ALLOWED_HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:allowed-host}
IW_REFUSED_HOSTNQN=${IW_REFUSED_HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:refused-host}
IW_TARGET_CMD=${IW_TARGET_CMD:-}

MODE=ironwire PORT="" READY_FILE="" ONLY="" SKIP="" SHOW=fail INSTALL=1

CHECKS=(discover-battery digest-battery sqflow-battery queues2-smp2 file4k-battery pattern-64m ext4-fs refused-host read-only namespace-aen restart-fio initiator-nvmet)
describe() {
	case $1 in
	discover-battery) echo "discovery + plain battery on $IW_NQN (ram)" ;;
	digest-battery) echo "battery with header+data digests" ;;
	sqflow-battery) echo "battery with SQ flow control disabled (reads: C2HData with SUCCESS, no response capsule)" ;;
	queues2-smp2) echo "battery with -i 2 on 2 vCPUs (2 I/O queues)" ;;
	file4k-battery) echo "battery on $IW_RESTRICTED_NQN (file, 4K LBA) as the allowed host" ;;
	pattern-64m) echo "64 MiB O_DIRECT pattern write / read back" ;;
	ext4-fs) echo "mkfs.ext4, 20 files, remount, sha256sums" ;;
	refused-host) echo "not-allowed host NQN refused, allowed host accepted" ;;
	read-only) echo "a read_only file device: the disk read-only (NSATTR), its data read, writes refused, the file unchanged (ironwire only)" ;;
	namespace-aen) echo "ironwire ctl adds, grows and removes a namespace; AEN makes the host rescan (ironwire only)" ;;
	restart-fio) echo "fio verify on the file namespace while ironwire drops the connections (ctl disconnect), restarts (SIGTERM) and is killed (SIGKILL); the host reconnects (ironwire only)" ;;
	initiator-nvmet) echo "ironwire's NVMe/TCP host (bench --verify, 4k/128k, digests) vs kernel nvmet-tcp (ironwire only)" ;;
	esac
}


usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit "${1:-0}"; }

while (($#)); do
	case $1 in
	--port) PORT=$2; shift 2 ;;
	--target) MODE=$2; shift 2 ;;
	--target-cmd) MODE=cmd IW_TARGET_CMD=$2; shift 2 ;;
	--ready-file) READY_FILE=$2; shift 2 ;;
	--only) ONLY=$2; shift 2 ;;
	--skip) SKIP=$2; shift 2 ;;
	--show) SHOW=$2; shift 2 ;;
	--no-install) INSTALL=0; shift ;;
	--list) for c in "${CHECKS[@]}"; do printf '%-18s %s\n' "$c" "$(describe "$c")"; done; exit 0 ;;
	-h|--help) usage 0 ;;
	*) echo "nvme-kernel: unknown argument $1 (try --help)" >&2; exit 2 ;;
	esac
done
[[ -n $IW_TARGET_CMD && $MODE == ironwire ]] && MODE=cmd
case $MODE in
ironwire) PORT=${PORT:-$(free_port)}; IW_READY_TIMEOUT=${IW_READY_TIMEOUT:-20} ;;
cmd) PORT=${PORT:-4420}; IW_READY_TIMEOUT=${IW_READY_TIMEOUT:-20} ;;
nvmet) PORT=${PORT:-14420}; IW_READY_TIMEOUT=${IW_READY_TIMEOUT:-90} ;;
*) echo "nvme-kernel: --target must be ironwire or nvmet" >&2; exit 2 ;;
esac
[[ $PORT =~ ^[0-9]+$ ]] || { echo "nvme-kernel: bad port $PORT" >&2; exit 2; }
if [[ $MODE == nvmet ]]; then RPORT=${IW_RESTRICTED_PORT:-$((PORT + 1))}; else RPORT=${IW_RESTRICTED_PORT:-$PORT}; fi




# ------------------------------------------------------------------ targets
WORK=$(mktemp -d "${IW_WORK_PARENT:-/var/tmp}/ironwire-interop.XXXXXX")
TARGET_PIDS=() TARGET_LOGS=() RESULTS=() FAILED=0

cleanup() {
	local rc=$? p
	stop_guest
	for p in "${TARGET_PIDS[@]}"; do stop_pid "$p"; done
	if [[ ${IW_KEEP_WORK:-0} == 1 || $FAILED != 0 || $rc != 0 ]]; then
		echo "nvme-kernel: logs kept in $WORK" >&2
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP





write_ironwire_config() { # FILE
	mkdir -p "$WORK/img"
	truncate -s 256M "$WORK/img/file0.img"
	make_golden
	cat >"$1" <<EOF
# generated by tests/interop/nvme-kernel.sh
[[device]]
name = "ram0"
kind = "ram"
size = "512MiB"
block_size = 512

[[device]]
name = "file0"
kind = "file"
path = "$WORK/img/file0.img"
size = "256MiB"
block_size = 4096

[[subsystem]]
nqn = "$IW_NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
device = "ram0"

[[subsystem]]
nqn = "$IW_RESTRICTED_NQN"
allow_any_host = false
hosts = ["$IW_ALLOWED_HOSTNQN"]
[[subsystem.namespace]]
nsid = 1
device = "file0"

$(golden_device_toml)

[[subsystem]]
nqn = "$IW_READONLY_NQN"
allow_any_host = true
[[subsystem.namespace]]
nsid = 1
device = "golden"

[[port]]
transport = "tcp"
address = "127.0.0.1:$PORT"

[control]
allow_paths = ["$WORK/img/"]
EOF
}

# start_ironwire LOG : serve the generated config (its PID last in
# TARGET_PIDS) and wait until it listens.
start_ironwire() {
	local extra=()
	# a control socket of our own, so as not to disturb another running ironwire
	"$IRONWIRE_BIN" serve --help 2>/dev/null | grep -q -- --ctl-socket && extra+=(--ctl-socket "$WORK/ctl.sock")
	RUST_LOG=${RUST_LOG:-info} start_target ironwire "$1" \
		"$IRONWIRE_BIN" serve --config "$WORK/ironwire.toml" "${extra[@]}"
	wait_ready "${TARGET_PIDS[-1]}" "$PORT"
}

start_targets() {
	local p
	for p in $(printf '%s\n' "$PORT" "$RPORT" | sort -u); do
		port_open "$p" && die "something already listens on 127.0.0.1:$p (stale target?)"
	done
	case $MODE in
	ironwire)
		[[ -x $IRONWIRE_BIN ]] || die "no ironwire binary at $IRONWIRE_BIN (cargo build --release, or set IRONWIRE_BIN)"
		write_ironwire_config "$WORK/ironwire.toml"
		start_ironwire "$WORK/ironwire.log" || return 1
		;;
	cmd)
		export IW_PORT=$PORT IW_READY_FILE=$WORK/target.ready
		[[ -n $READY_FILE ]] && rm -f "$READY_FILE"
		start_target target-cmd "$WORK/target.log" bash -c "$IW_TARGET_CMD"
		wait_ready "${TARGET_PIDS[0]}" "$PORT" "$READY_FILE" || return 1
		;;
	nvmet)
		start_target nvmet-main "$WORK/nvmet-main.log" "$KP" target-nvmet --show always -t 1800 \
			--nqn "$IW_NQN" --size 256 --ready-file "$WORK/ready-main" "$PORT"
		start_target nvmet-restricted "$WORK/nvmet-restricted.log" "$KP" target-nvmet --show always -t 1800 \
			--nqn "$IW_RESTRICTED_NQN" --backend null_blk --block-size 4096 --size 128 \
			--allow-host "$IW_ALLOWED_HOSTNQN" --ready-file "$WORK/ready-restricted" "$RPORT"
		wait_ready "${TARGET_PIDS[0]}" "$PORT" "$WORK/ready-main" || return 1
		wait_ready "${TARGET_PIDS[1]}" "$RPORT" "$WORK/ready-restricted" || return 1
		;;
	esac
}




# check NAME TIMEOUT kernel-peer-run-args... : one guest boot, one scenario
check() {
	local name=$1 limit=$2; shift 2
	selected "$name" || return 0
	if ! targets_alive; then
		say "$name: SKIPPED, a target process has exited"
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
	# ironwire must also pass the kernel's own discard path (blkdiscard).
	local strict=()
	[[ $MODE == ironwire ]] && strict=(-e NVME_STRICT_DISCARD=1)
	check discover-battery 150 "${strict[@]}" -e NVME_REQUIRE_DISCOVERED=1 nvme-tcp "$PORT" "$IW_NQN"
	check digest-battery 180 "${strict[@]}" -e NVME_DIGEST=1 nvme-tcp "$PORT" "$IW_NQN"
	check sqflow-battery 180 "${strict[@]}" -e NVME_EXTRA=--disable-sqflow nvme-tcp "$PORT" "$IW_NQN"
	check queues2-smp2 180 --smp 2 "${strict[@]}" -e NVME_QUEUES=2 nvme-tcp "$PORT" "$IW_NQN"
	check file4k-battery 150 "${strict[@]}" -e KP_HOSTNQN="$IW_ALLOWED_HOSTNQN" nvme-tcp "$RPORT" "$IW_RESTRICTED_NQN"
	if selected pattern-64m; then
		head -c 64M /dev/urandom >"$WORK/pattern.bin"
		local sum; sum=$(sha256sum <"$WORK/pattern.bin" | cut -d' ' -f1)
		check pattern-64m 180 -f "$WORK/pattern.bin:/kp/files/pattern.bin" \
			-e PATTERN_FILE=/kp/files/pattern.bin -e PATTERN_SHA256="$sum" -e PATTERN_MIB=64 \
			nvme-pattern "$PORT" "$IW_NQN"
		rm -f "$WORK/pattern.bin"
	fi
	check ext4-fs 180 -e FS_FILES=20 -e FS_MAX_KIB=4096 nvme-fs "$PORT" "$IW_NQN"
	check refused-host 120 -e KP_HOSTNQN="$IW_REFUSED_HOSTNQN" -e ALLOWED_HOSTNQN="$IW_ALLOWED_HOSTNQN" \
		nvme-refused "$RPORT" "$IW_RESTRICTED_NQN"
	[[ $MODE == ironwire ]] && check_read_only nvme-readonly "$PORT" "$IW_READONLY_NQN"
	[[ $MODE == ironwire ]] && ON_MARKER=aen_event MARKERS="AEN-ADD AEN-GROW AEN-REMOVE" \
		check namespace-aen 150 nvme-aen "$PORT" "$IW_NQN"
	[[ $MODE == ironwire ]] && check_restart restart-fio 300 -e KP_HOSTNQN="$IW_ALLOWED_HOSTNQN" \
		nvme-restart "$RPORT" "$IW_RESTRICTED_NQN"
	# The roles turned round: ironwire's own NVMe/TCP host against the
	# kernel's nvmet-tcp in a target guest, with and without digests.
	[[ $MODE == ironwire ]] && check_initiator_nvmet tcp 4k:plain 128k:plain 16k:digest
}

# The namespace-changed event needs the host side to act mid-scenario: the
# guest prints a marker, the runner edits the daemon with `ironwire ctl`.
aen_event() {
	local ctl=("$IRONWIRE_BIN" ctl --socket "$WORK/ctl.sock")
	case $1 in
	AEN-ADD)
		"${ctl[@]}" add device name=aen0 kind=file path="$WORK/img/aen0.img" size=64MiB &&
			"${ctl[@]}" ns-add "$IW_NQN" 2 aen0 ;;
	AEN-GROW) "${ctl[@]}" set device name=aen0 size=96MiB ;;
	AEN-REMOVE) "${ctl[@]}" ns-remove "$IW_NQN" 2 ;;
	*) say "unexpected marker KP-$1-NOW"; return 1 ;;
	esac
}

# ------------------------------------------------------------------ main
T0=$(now)
cd "$REPO" || die "no repo at $REPO"
ensure_host_tools
if ! start_targets; then
	dump_target_logs
	FAILED=1
	exit 1
fi
run_checks
for p in "${TARGET_PIDS[@]}"; do
	kill -0 "$p" 2>/dev/null || { echo "nvme-kernel: a target process exited during the run" >&2; FAILED=1; }
done
((FAILED)) && dump_target_logs

printf '\n===== NVMe/TCP kernel-host interop (%s, 127.0.0.1:%s) =====\n' \
	"$([[ $MODE == ironwire ]] && echo "$IRONWIRE_BIN" || echo "$MODE")" "$PORT"
printf '%-18s %-17s %8s  %s\n' CHECK RESULT TIME WHAT
for r in "${RESULTS[@]}"; do echo "$r"; done
printf 'total wall %ss\n' "$(since "$T0")"
((${#RESULTS[@]})) || { echo "nvme-kernel: no check selected" >&2; exit 1; }
exit "$FAILED"
