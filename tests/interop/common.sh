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
