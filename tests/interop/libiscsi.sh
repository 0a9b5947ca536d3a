#!/usr/bin/env bash
# libiscsi's conformance suite (iscsi-test-cu, Debian's libiscsi-bin) against
# ironwire's iSCSI target on 127.0.0.1.
#
# Starts "$IRONWIRE_BIN" serve with a generated config (two iSCSI portals on
# free ports, its own --ctl-socket in a temp dir) and runs the whole suite
# (-t ALL, --dataloss --allow-sanitize) once per LUN configuration:
#   ram512  1 GiB RAM device, 512-byte blocks (LBPRZ, thin)
#   file4k  256 MiB file device, 4096-byte blocks, in the temp dir
# Each run passes both portals' URLs, so the MultipathIO tests run over two
# sessions (one per portal) to the same LU.
#
# Writes one line per test to the results file:
#   <config> TAB <Suite.Test> TAB passed|failed|skipped TAB <reason>
# prints each run's CUnit Run Summary and a total, kills what it started,
# and exits 1 if any test FAILED (or a run did not finish).
#
# Usage: tests/interop/libiscsi.sh [--results FILE] [--only ram512|file4k]
#          [--tests SPEC] [--no-install]
#   --results FILE  per-test results (default: results.tsv in the temp dir,
#                   which is then kept; otherwise it is kept only on failure)
#   --only CONFIG   run one configuration
#   --tests SPEC    iscsi-test-cu -t SPEC (default ALL)
# Env: IRONWIRE_BIN (default <repo>/target/release/ironwire),
#      LIBISCSI_TIMEOUT (seconds per run, default 150), RUST_LOG (default warn).
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
IRONWIRE_BIN=${IRONWIRE_BIN:-$REPO/target/release/ironwire}
RUN_TIMEOUT=${LIBISCSI_TIMEOUT:-150}
IQN=iqn.2026-11.io.ironwire:libiscsi
INITIATOR=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test
INITIATOR2=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2

RESULTS="" ONLY="" TESTS=ALL INSTALL=1
while [ $# -gt 0 ]; do
	case $1 in
	--results) RESULTS=$2; shift 2 ;;
	--only) ONLY=$2; shift 2 ;;
	--tests) TESTS=$2; shift 2 ;;
	--no-install) INSTALL=0; shift ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "libiscsi.sh: unknown option $1" >&2; exit 2 ;;
	esac
done

if ! command -v iscsi-test-cu >/dev/null; then
	if [ "$INSTALL" = 1 ]; then
		echo "installing libiscsi-bin" >&2
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libiscsi-bin) >&2 || {
			echo "libiscsi.sh: could not install libiscsi-bin" >&2
			exit 2
		}
	else
		echo "libiscsi.sh: iscsi-test-cu not found (apt-get install libiscsi-bin)" >&2
		exit 2
	fi
fi
if [ ! -x "$IRONWIRE_BIN" ]; then
	echo "libiscsi.sh: $IRONWIRE_BIN not found; run cargo build --release -p ironwire" >&2
	exit 2
fi

WORK=$(mktemp -d /tmp/ironwire-libiscsi.XXXXXX)
RESULTS=${RESULTS:-$WORK/results.tsv}
: >"$RESULTS"
DAEMON_PID=""
cleanup() {
	if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
		kill "$DAEMON_PID" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$DAEMON_PID" 2>/dev/null
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Turns iscsi-test-cu's CUnit output into result lines. A test printing
# [SKIPPED] counts as "passed" for CUnit; here it is "skipped" with the
# reason it printed.
parse() { # config logfile
	python3 - "$1" "$2" <<'EOF'
import re, sys
config, path = sys.argv[1], sys.argv[2]
suite = test = None
buf = []
def finish(ok):
    global test, buf
    if test is None:
        return
    skips = [l.split('[SKIPPED]', 1)[1].strip() for l in buf if '[SKIPPED]' in l]
    if ok and skips:
        state, why = 'skipped', skips[0]
    elif ok:
        state, why = 'passed', ''
    else:
        fails = [l.strip() for l in buf if '[FAILED]' in l]
        state, why = 'failed', fails[0] if fails else ''
    print(f"{config}\t{suite}.{test}\t{state}\t{why}")
    test, buf = None, []
for line in open(path, errors='replace'):
    line = line.rstrip('\n')
    m = re.match(r'^Suite: (\S+)', line)
    if m:
        suite = m.group(1)
        continue
    m = re.match(r'^  Test: (\S+) \.\.\.(.*)$', line)
    if m:
        test, rest = m.group(1), m.group(2)
        buf = [rest]
        if rest.endswith('FAILED'):
            finish(False)
        elif rest.endswith('passed'):
            finish(True)
        continue
    if test is None:
        continue
    buf.append(line)
    if line.endswith('FAILED'):
        finish(False)
    elif line.endswith('passed'):
        finish(True)
EOF
}

run_config() { # name device-toml
	local name=$1 device=$2 p1 p2 log=$WORK/$1.log
	p1=$(free_port) p2=$(free_port)
	while [ "$p2" = "$p1" ]; do p2=$(free_port); done
	cat >"$WORK/$name.toml" <<EOF
$device

[[iscsi_target]]
iqn = "$IQN"
allow_any_initiator = true
[[iscsi_target.lun]]
lun = 0
device = "lun0"

[[port]]
transport = "iscsi"
address = "127.0.0.1:$p1"

[[port]]
transport = "iscsi"
address = "127.0.0.1:$p2"
EOF
	RUST_LOG=${RUST_LOG:-warn} "$IRONWIRE_BIN" serve --config "$WORK/$name.toml" \
		--ctl-socket "$WORK/$name.sock" >"$WORK/$name.daemon.log" 2>&1 &
	DAEMON_PID=$!
	local up=0
	for _ in $(seq 100); do
		if ! kill -0 "$DAEMON_PID" 2>/dev/null; then break; fi
		if (exec 3<>"/dev/tcp/127.0.0.1/$p1") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$p2") 2>/dev/null; then
			up=1
			break
		fi
		sleep 0.1
	done
	if [ "$up" != 1 ]; then
		echo "== $name: ironwire did not come up" >&2
		tail -50 "$WORK/$name.daemon.log" >&2
		echo -e "$name\t(daemon)\tfailed\tironwire did not start" >>"$RESULTS"
		cleanup
		return 1
	fi
	echo "== $name: iscsi-test-cu -t $TESTS on 127.0.0.1:$p1 and :$p2" >&2
	timeout "$RUN_TIMEOUT" iscsi-test-cu --dataloss --allow-sanitize -i "$INITIATOR" -I "$INITIATOR2" -t "$TESTS" \
		"iscsi://127.0.0.1:$p1/$IQN/0" "iscsi://127.0.0.1:$p2/$IQN/0" >"$log" 2>&1
	local rc=$?
	cleanup
	DAEMON_PID=""
	parse "$name" "$log" >>"$RESULTS"
	sed -n '/^Run Summary:/,/^Elapsed/p' "$log"
	if [ "$rc" = 124 ]; then
		echo "== $name: iscsi-test-cu did not finish in ${RUN_TIMEOUT}s" >&2
		echo -e "$name\t(run)\tfailed\ttimed out after ${RUN_TIMEOUT}s" >>"$RESULTS"
		return 1
	fi
	if ! grep -q '^Run Summary:' "$log"; then
		echo "== $name: iscsi-test-cu exited $rc without a summary" >&2
		tail -30 "$log" >&2
		echo -e "$name\t(run)\tfailed\tno CUnit summary (exit $rc)" >>"$RESULTS"
		return 1
	fi
	return 0
}

RAM512='[[device]]
name = "lun0"
kind = "ram"
size = "1GiB"
block_size = 512'
FILE4K="[[device]]
name = \"lun0\"
kind = \"file\"
path = \"$WORK/lun0.img\"
size = \"256MiB\"
block_size = 4096"

status=0
for cfg in ram512 file4k; do
	[ -n "$ONLY" ] && [ "$ONLY" != "$cfg" ] && continue
	case $cfg in
	ram512) run_config ram512 "$RAM512" || status=1 ;;
	file4k) run_config file4k "$FILE4K" || status=1 ;;
	esac
done

passed=$(awk -F'\t' '$3 == "passed"' "$RESULTS" | wc -l)
failed=$(awk -F'\t' '$3 == "failed"' "$RESULTS" | wc -l)
skipped=$(awk -F'\t' '$3 == "skipped"' "$RESULTS" | wc -l)
if [ "$failed" -gt 0 ]; then
	echo "FAILED tests:"
	awk -F'\t' '$3 == "failed" { print "  " $1 " " $2 ": " $4 }' "$RESULTS"
	status=1
fi
echo "results: $RESULTS"
case $RESULTS in
"$WORK"/*) echo "logs: $WORK" ;;
*) if [ "$status" = 0 ]; then rm -rf "$WORK"; else echo "logs: $WORK"; fi ;;
esac
echo "libiscsi: $passed passed, $failed failed, $skipped skipped"
exit "$status"
