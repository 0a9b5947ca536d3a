# Helpers shared by the kernel-host runners (nvme-kernel.sh, iscsi-kernel.sh,
# nvme-rdma.sh, nvme-rbd.sh) and prepare.sh.
# Source it after setting TOOL (the name in log lines), KP (the kernel-peer
# script) and INSTALL (0: never apt-get).

say() { printf '\n##### [%s %s] %s\n' "$TOOL" "$(date +%T)" "$*" >&2; }
die() { printf '%s: error: %s\n' "$TOOL" "$*" >&2; exit 2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

# A port nothing listens on, so a stray daemon (or a second run) can't
# collide with ours.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

as_root() { if ((EUID == 0)); then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi; }
APT_UPDATED=0
apt_update() { ((APT_UPDATED)) && return 0; say "apt-get update"; as_root apt-get update -qq || die "apt-get update failed"; APT_UPDATED=1; }
# apt_install WHY PKG... : installs the packages (without recommends), or
# dies; WHY goes in the log line ("" for none).
apt_install() {
	local why=${1:+ ($1)}
	shift
	apt_update
	say "apt-get install $*$why"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" ||
		die "apt-get install $* failed"
}

# QEMU and the tools kernel-peer needs, then its (cached) kernel and initramfs.
ensure_host_tools() {
	local need=()
	command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
	command -v cpio >/dev/null || need+=(cpio)
	command -v xz >/dev/null || need+=(xz-utils)
	command -v gzip >/dev/null || need+=(gzip)
	command -v python3 >/dev/null || need+=(python3)
	{ command -v flock && command -v setsid; } >/dev/null || need+=(util-linux)
	if ((${#need[@]})); then
		((INSTALL)) || die "missing host tools (${need[*]}) and --no-install given"
		apt_install "" "${need[@]}"
	fi
	# kernel-peer prepare downloads Debian packages (apt-get download) unless
	# its cache is complete; that needs package lists.
	if ! "$KP" prepare --check 2>/dev/null; then
		((INSTALL)) && apt_update
		say "kernel-peer prepare (cache $KP_CACHE)"
	fi
	"$KP" prepare || die "kernel-peer prepare failed"
}

# ensure_siw : the guest kernel and initramfs with siw.ko (the caller
# exports KP_SIW=1). When the initramfs for this configuration is not
# cached yet, kernel-peer may have to build siw.ko (and fails if it
# cannot): install what the build needs first. A cached one has siw.ko.
ensure_siw() {
	local need=()
	if ! "$KP" prepare --check 2>/dev/null; then
		command -v gcc >/dev/null || need+=(gcc)
		command -v make >/dev/null || need+=(make)
		command -v patch >/dev/null || need+=(patch)
		command -v strip >/dev/null || need+=(binutils)
	fi
	if ((${#need[@]})); then
		((INSTALL)) || die "building siw.ko needs ${need[*]}, and --no-install given"
		apt_install "to build siw.ko" "${need[@]}"
	fi
	ensure_host_tools
}

# ensure_fio_layer : the guest's fio layer (KP_WITH_FIO=1), built from the
# host's fio package (installed here unless --no-install).
FIO_LAYER=0
ensure_fio_layer() {
	if ! command -v fio >/dev/null; then
		((INSTALL)) || return 1
		apt_install "for the guest's fio layer" fio
	fi
	KP_WITH_FIO=1 "$KP" prepare || die "kernel-peer prepare (fio layer) failed"
	FIO_LAYER=1
}

# check_restart NAME TIMEOUT kernel-peer-run-args... : a target whose
# connections go away under load (the nvme-restart and iscsi-restart
# scenarios, with the fio layer). At each marker the guest prints, the
# runner drops every connection with `ironwire ctl disconnect` (DROP: the
# daemon keeps running, as in a network blip), stops ironwire with SIGTERM
# (RESTART: the graceful stop, which must exit 0) or SIGKILL (KILL), and
# serves again with the script's start_ironwire; the host must reconnect
# and fio's verify must stay clean. Run it on a file namespace or LU, so
# that what was acknowledged outlives the process. The script's `check`
# runs it.
check_restart() {
	selected "$1" || return 0
	if ! ensure_fio_layer; then
		say "$1: FAIL (no fio layer for the guest)"
		record "$1" 1 0; return 0
	fi
	RESTARTS=0
	KP_WITH_FIO=1 ON_MARKER=restart_event MARKERS="DROP RESTART KILL" check "$@"
}

# restart_event DROP|RESTART|KILL : check_restart's marker handler.
restart_event() {
	case $1 in
	DROP) drop_connections ;;
	RESTART | KILL)
		RESTARTS=$((${RESTARTS:-0} + 1))
		restart_ironwire "$1" "$RESTARTS" ||
			{ say "ironwire did not stop or start cleanly ($1)"; return 1; } ;;
	*) say "unexpected marker KP-$1-NOW"; return 1 ;;
	esac
}

# drop_connections : `ironwire ctl disconnect` of every connection from
# the guest (127.0.0.1 through QEMU's NAT); at least one must close.
drop_connections() {
	local out
	out=$("$IRONWIRE_BIN" ctl --socket "$WORK/ctl.sock" disconnect address=127.0.0.1 2>&1)
	say "ctl disconnect address=127.0.0.1: $(head -n 1 <<<"$out")"
	[[ $out =~ ^closed\ [1-9][0-9]*\ connection ]]
}

# restart_ironwire RESTART|KILL N : stops the running ironwire (the graceful
# stop must end with status 0 within its drain) and serves again with the
# script's `start_ironwire LOG`, logging to ironwire.N.log.
restart_ironwire() {
	((${#TARGET_PIDS[@]})) || { say "no ironwire to restart"; return 1; }
	local how=$1 n=$2 p=${TARGET_PIDS[0]} st=0 i
	if [[ $how == KILL ]]; then kill -KILL "$p"; else kill -TERM "$p"; fi
	for i in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$p" 2>/dev/null; then
		say "ironwire still running 20 s after SIGTERM"
		kill -KILL "$p"
		st=1
	fi
	wait "$p"
	local code=$?
	say "ironwire ($how) exited with status $code"
	if [[ $how == RESTART ]] && ((code != 0)); then st=1; fi
	TARGET_PIDS=("${TARGET_PIDS[@]:1}")
	start_ironwire "$WORK/ironwire.$n.log" || return 1
	# the new daemon first in the list, as the one the next restart stops
	TARGET_PIDS=("${TARGET_PIDS[-1]}" "${TARGET_PIDS[@]:0:${#TARGET_PIDS[@]}-1}")
	return "$st"
}

# kp_run LOG TIMEOUT kernel-peer-run-args... : one scenario in a fresh guest.
# A guest that never reaches its scenario (a soft lockup while booting under
# TCG on a busy host, seen with more vCPUs than host cores) has tested
# nothing of the target: that boot is retried once, and said so.
# With ON_MARKER set to a function, the runner acts mid-scenario: each
# KP-<WORD>-NOW line the guest prints calls `$ON_MARKER WORD` once, in
# order, and the run fails if a handler fails or if the words handled are
# not MARKERS (space-separated) when that is set.
# A marker run is never run again, so that a second run cannot hide what
# the runner's actions did, with one exception: RETRY_GUEST_FAILURE=1 (set
# by a caller for a check whose guest side is known to flake) runs it once
# more when the guest failed although every action of the runner
# succeeded, and says so; the first console is kept as LOG.first.
kp_run() {
	local log=$1 limit=$2 rc=0; shift 2
	kp_run_once "$log" "$limit" "$@" || rc=$?
	if ((rc != 0)) && ! grep -q '^KP-SCENARIO-START' "$log" 2>/dev/null && [[ -z $(markers_in "$log") ]]; then
		say "the guest never reached its scenario (rc=$rc, console: $log.boot-failure); booting it once more"
		mv -f "$log" "$log.boot-failure" 2>/dev/null
		rc=0
		kp_run_once "$log" "$limit" "$@" || rc=$?
	elif ((rc != 0)) && [[ ${RETRY_GUEST_FAILURE:-} == 1 && -n $(markers_in "$log") ]] && ((KP_HANDLERS_FAILED == 0)); then
		say "RETRY: the guest failed (rc=$rc, console: $log.first) although every action of the runner succeeded; running the check once more"
		mv -f "$log" "$log.first" 2>/dev/null
		rc=0
		kp_run_once "$log" "$limit" "$@" || rc=$?
	fi
	return "$rc"
}

# KP_HANDLERS_FAILED: 1 when a marker handler of the last kp_run_once failed.
KP_HANDLERS_FAILED=0
kp_run_once() {
	local log=$1 limit=$2 rc=0 word marked="" late=""; shift 2
	KP_HANDLERS_FAILED=0
	if [[ -z ${ON_MARKER:-} ]]; then
		"$KP" run --show "$SHOW" --log "$log" -t "$limit" "$@"
		return
	fi
	[[ -n ${MARKERS:-} ]] || { say "ON_MARKER=$ON_MARKER set without MARKERS"; return 2; }
	: >"$log"
	# --show always streams the console as it happens (--log is written at the end).
	"$KP" run --show always -t "$limit" "$@" >"$log" 2>&1 &
	GUEST_PID=$!
	while kill -0 "$GUEST_PID" 2>/dev/null; do
		while read -r word; do
			[[ " $marked " == *" $word "* ]] && continue
			marked+=" $word"
			"$ON_MARKER" "$word" </dev/null || { rc=1; KP_HANDLERS_FAILED=1; }
		done < <(markers_in "$log")
		sleep 0.2
	done
	wait "$GUEST_PID" || rc=$?
	GUEST_PID=""
	while read -r word; do
		[[ " $marked " == *" $word "* ]] || late+=" $word"
	done < <(markers_in "$log")
	[[ -z $late ]] || say "markers the guest printed as it ended, not acted on:$late"
	if [[ $marked != " $MARKERS" ]]; then
		say "the guest's markers acted on were${marked:- none}, expected $MARKERS"
		((rc != 0)) || rc=1
	fi
	((rc == 0)) || [[ $SHOW == never ]] || tail -n 60 "$log" >&2
	return "$rc"
}

# markers_in LOG : the words of the KP-<WORD>-NOW markers in LOG, in order.
markers_in() { grep -o 'KP-[A-Z0-9-]*-NOW' "$1" 2>/dev/null | sed 's/^KP-//; s/-NOW$//'; }

# stop_guest : the guest a marker run left running (the runner is exiting).
GUEST_PID=""
stop_guest() {
	[[ -z $GUEST_PID ]] || stop_pid "$GUEST_PID"
	GUEST_PID=""
}

# ------------------------------------------------ the runners' shared state
# The scripts keep TARGET_PIDS / TARGET_LOGS (what they started), RESULTS and
# FAILED (the summary), ONLY / SKIP (the --only / --skip lists) and define
# describe NAME (a check's one-line description).

stop_pid() { # stop one process group we started (setsid) by its id, then the PID
	local p=$1 i
	kill -0 "$p" 2>/dev/null || { wait "$p" 2>/dev/null; return 0; }
	kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
	for i in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$p" 2>/dev/null; then kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; fi
	wait "$p" 2>/dev/null
	return 0
}

# start_target NAME LOG CMD... : start CMD in its own session, in the background
start_target() {
	local name=$1 log=$2; shift 2
	say "starting $name: $*"
	setsid "$@" >"$log" 2>&1 </dev/null &
	TARGET_PIDS+=("$!")
	TARGET_LOGS+=("$name:$log")
}

dump_target_logs() {
	local e
	for e in "${TARGET_LOGS[@]}"; do
		printf '\n----- %s log (%s, last 200 lines) -----\n' "${e%%:*}" "${e#*:}" >&2
		tail -n 200 "${e#*:}" >&2
	done
}

# wait_ready PID PORT [READY_FILE] : target PID accepts connections on PORT,
# or, given READY_FILE, has written it. A guest target is never probed with a
# connect: QEMU's port forward accepts before the guest is up, and one bare
# TCP connect + close to the kernel's nvmet-rdma/siw listener (no MPA
# request) leaves that listener resetting every later connection.
wait_ready() {
	local pid=$1 port=$2 ready=${3:-} t0 deadline
	t0=$(now); deadline=$(( $(date +%s) + IW_READY_TIMEOUT ))
	while (( $(date +%s) < deadline )); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "$TOOL: target exited before it was ready" >&2; return 1
		fi
		if { [[ -n $ready ]] && [[ -s $ready ]]; } || { [[ -z $ready ]] && port_open "$port"; }; then
			say "target on 127.0.0.1:$port ready after $(since "$t0")s"
			return 0
		fi
		sleep 0.2
	done
	echo "$TOOL: target not ready on 127.0.0.1:$port after ${IW_READY_TIMEOUT}s" >&2
	return 1
}

targets_alive() {
	local p
	for p in "${TARGET_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || return 1; done
}

selected() { # NAME
	[[ -n $ONLY && ",$ONLY," != *",$1,"* ]] && return 1
	[[ -n $SKIP && ",$SKIP," == *",$1,"* ]] && return 1
	return 0
}

record() { # NAME RC SECONDS
	local st=PASS
	if [[ $2 != 0 ]]; then
		FAILED=1
		case $2 in 124) st="FAIL(timeout)" ;; 125) st="FAIL(guest died)" ;; *) st="FAIL(rc=$2)" ;; esac
	fi
	RESULTS+=("$(printf '%-18s %-17s %7ss  %s' "$1" "$st" "$3" "$(describe "$1")")")
}

# bench_verify NAME TAG PORT NQN BS TRANSPORT [FLAG...] : one run of
# ironwire's own NVMe-oF host, `bench run --transport TRANSPORT --rw randrw
# --verify`, against the target on 127.0.0.1:PORT. It passes if the bench
# exits 0 and says "verify OK", and its JSON shows reads and writes done,
# blocks checked, no verify error, the block size asked, and, over RDMA,
# the MPA CRC mode asked for (--no-crc; the kernel's siw uses CRC exactly
# when the host asks for it). IRONWIRE_BIN, WORK; IW_BENCH_TIME seconds (4).
bench_verify() {
	local name=$1 tag=$2 port=$3 nqn=$4 bs=$5 transport=$6; shift 6
	local out=$WORK/$name.$tag.json err=$WORK/$name.$tag.err rc=0 t0 crc=- summary secs=${IW_BENCH_TIME:-4}
	[[ $transport == rdma ]] && crc=on
	[[ $transport == rdma && ${1:-} == --no-crc ]] && crc=off
	local args=(bench run --nvme "127.0.0.1:$port" --nqn "$nqn" --transport "$transport" "$@" --rw randrw --bs "$bs"
		--qd 8 --time "$secs" --verify --size 64M --output json)
	echo "+ $IRONWIRE_BIN ${args[*]}" >&2
	t0=$(now)
	timeout -k 5 $((${secs%.*} + 60)) "$IRONWIRE_BIN" "${args[@]}" >"$out" 2>"$err" || rc=$?
	if ((rc == 0)) && ! grep -q '^verify OK' "$err"; then
		echo "$name [$tag]: the bench exited 0 without a 'verify OK' line" >&2; rc=1
	fi
	if ((rc == 0)); then
		summary=$(python3 - "$out" "$bs" "$crc" <<'PY'
import json, sys
path, bs, crc = sys.argv[1], sys.argv[2], sys.argv[3]
d = json.load(open(path))
j = d["jobs"][0]
r, w = j["read"]["total_ios"], j["write"]["total_ios"]
mult = {"k": 1024, "m": 1 << 20}.get(bs[-1].lower(), 1)
want_bs = int(bs.rstrip("kKmM")) * mult
bad = []
if j["error"] != 0: bad.append(f"error {j['error']}")
if j["verify_errors"] != 0 or j["first_verify_error"] is not None:
    bad.append(f"{j['verify_errors']} verify errors, first: {j['first_verify_error']}")
if j["verify_checked"] <= 0: bad.append("no block checked")
if r <= 0 or w <= 0: bad.append(f"{r} reads, {w} writes")
if d["global options"]["bs"] != want_bs: bad.append(f"bs {d['global options']['bs']} (asked {want_bs})")
crc_off = "(crc off)" in d["target"]
if crc != "-" and crc_off != (crc == "off"):
    bad.append(f"MPA CRC {'off' if crc_off else 'on'} (asked {crc}): {d['target']}")
print(f"{r} reads, {w} writes, {j['verify_checked']} blocks checked, 0 corrupt; {d['target']}")
if bad:
    print("; ".join(bad), file=sys.stderr)
    sys.exit(1)
PY
		) || rc=1
	fi
	if ((rc == 0)); then
		say "$name [$tag]: PASS in $(since "$t0")s: $summary"
	else
		say "$name [$tag]: FAIL (rc=$rc) after $(since "$t0")s; bench stderr ($err):"
		grep -v '^\[ *[0-9]* s\]' "$err" | tail -n 20 >&2
	fi
	return "$rc"
}

# check_initiator_nvmet TRANSPORT RUN... : the check initiator-nvmet, the
# roles turned round. A target guest runs the kernel's own nvmet over
# TRANSPORT (`kernel-peer target-nvmet`, brd, any host; rdma on siw), and
# ironwire's NVMe-oF host verifies randrw through it, once per RUN,
# BS:VARIANT (VARIANT: crc or no-crc over RDMA, plain or digest over TCP).
# The guest is stopped by PID afterwards. KP, WORK, SHOW, TARGET_PIDS.
check_initiator_nvmet() {
	local transport=$1; shift
	local name=initiator-nvmet
	selected "$name" || return 0
	local nqn=nqn.2024-01.org.kernel-peer:nvmet port tpid t0 rc=0 run flags=()
	local tlog=$WORK/$name.target.log ready=$WORK/$name.ready
	[[ -x $IRONWIRE_BIN ]] || { say "$name: no ironwire binary at $IRONWIRE_BIN"; record "$name" 1 0; return 0; }
	say "$name: $(describe "$name")"
	t0=$(now)
	port=$(free_port)
	start_target "$name-nvmet" "$tlog" "$KP" target-nvmet --transport "$transport" --show always -t 300 \
		--nqn "$nqn" --size 128 --ready-file "$ready" "$port"
	tpid=${TARGET_PIDS[-1]}
	# never probe the port: a bare connect wedges the nvmet-rdma/siw listener
	if IW_READY_TIMEOUT=90 wait_ready "$tpid" "$port" "$ready"; then
		for run in "$@"; do
			case ${run#*:} in
			no-crc) flags=(--no-crc) ;;
			digest) flags=(--hdgst --ddgst) ;;
			*) flags=() ;;
			esac
			bench_verify "$name" "${run/:/-}" "$port" "$nqn" "${run%%:*}" "$transport" "${flags[@]}" || rc=1
		done
		kill -0 "$tpid" 2>/dev/null || { say "$name: the nvmet guest exited during the runs"; rc=1; }
	else
		rc=1
	fi
	stop_pid "$tpid"
	# it is no longer a target of this run (targets_alive, the end check)
	unset 'TARGET_PIDS[-1]' 'TARGET_LOGS[-1]'
	if ((rc != 0)) && [[ $SHOW != never ]]; then
		printf '\n----- %s: nvmet guest console (%s, last 60 lines) -----\n' "$name" "$tlog" >&2
		tail -n 60 "$tlog" >&2
	fi
	record "$name" "$rc" "$(since "$t0")"
	say "$name: $( ((rc == 0)) && echo PASS || echo "FAIL (rc=$rc, bench output: $WORK/$name.*.err, target console: $tlog)")"
}

# The `read-only` check of the kernel-host runners: a golden image of
# GOLDEN_MIB MiB of random data (make_golden, in $WORK/img), exported as the
# read-only file device "golden" (golden_device_toml, for the runner's
# generated configuration).
GOLDEN_MIB=16
make_golden() { head -c "${GOLDEN_MIB}M" /dev/urandom >"$WORK/img/golden.img"; }
golden_device_toml() {
	printf '[[device]]\nname = "golden"\nkind = "file"\npath = "%s"\nread_only = true\n' "$WORK/img/golden.img"
}

# check_read_only SCENARIO ARGS... : runs the runner's `check read-only` with
# the golden image's checksum, then checks that the target's file is unchanged.
check_read_only() {
	selected read-only || return 0
	local golden; golden=$(sha256sum <"$WORK/img/golden.img" | cut -d' ' -f1)
	check read-only 150 -e GOLDEN_MIB="$GOLDEN_MIB" -e GOLDEN_SHA256="$golden" "$@"
	[[ $(sha256sum <"$WORK/img/golden.img" | cut -d' ' -f1) == "$golden" ]] ||
		{ say "read-only: the golden image changed on the target's side"; record read-only-file 1 0; }
}
