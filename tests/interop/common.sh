# Helpers shared by the kernel-host runners (nvme-kernel.sh, iscsi-kernel.sh).
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
		apt_update
		say "apt-get install ${need[*]}"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ||
			die "apt-get install ${need[*]} failed"
	fi
	# kernel-peer prepare downloads Debian packages (apt-get download) unless
	# its cache is complete; that needs package lists.
	if ! "$KP" prepare --check 2>/dev/null; then
		((INSTALL)) && apt_update
		say "kernel-peer prepare (cache $KP_CACHE)"
	fi
	"$KP" prepare || die "kernel-peer prepare failed"
}

# kp_run LOG TIMEOUT kernel-peer-run-args... : one scenario in a fresh guest.
# A guest that never reaches its scenario (a soft lockup while booting under
# TCG on a busy host, seen with more vCPUs than host cores) has tested
# nothing of the target: that boot is retried once, and said so.
kp_run() {
	local log=$1 limit=$2 rc=0; shift 2
	"$KP" run --show "$SHOW" --log "$log" -t "$limit" "$@" || rc=$?
	if ((rc != 0)) && ! grep -q '^KP-SCENARIO-START' "$log" 2>/dev/null; then
		say "the guest never reached its scenario (rc=$rc, console: $log.boot-failure); booting it once more"
		mv -f "$log" "$log.boot-failure" 2>/dev/null
		rc=0
		"$KP" run --show "$SHOW" --log "$log" -t "$limit" "$@" || rc=$?
	fi
	return "$rc"
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
