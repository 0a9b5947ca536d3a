#!/bin/sh
# One host, two transports, one subsystem: NVMe/TCP and NVMe/RDMA (soft-iWARP,
# siw0 on eth0) to the SAME target address:port and NQN at the same time.
# Steps: siw up, nvme-tcp + nvme-rdma loaded; `nvme discover` over TCP and over
# RDMA (each discovery log must list NQN with the matching trtype); connect
# -t tcp, then -t rdma; the kernel must put both controllers in ONE
# nvme-subsystem, both live, one per transport, with different cntlids.
# With native multipath (Debian's default) the namespace is one head device
# with two paths:
#   1. iopolicy round-robin: a pattern written and read back through the head
#      while both paths are up (per-path stats must show both carried I/O);
#   2. `nvme disconnect -d` the RDMA controller: read 1 back and write a 2nd
#      pattern through the TCP path alone; reconnect RDMA;
#   3. disconnect the TCP controller: pattern 2 (written over TCP) must read
#      back through the RDMA path; write a 3rd pattern over RDMA; reconnect TCP;
#   4. disconnect the RDMA controller: pattern 3 (written over RDMA) must read
#      back through the TCP path; reconnect RDMA;
# without multipath (nvme_core multipath=N) each controller has its own
# namespace device: write through one, read back through the other, both ways.
# Finally `nvme disconnect -n NQN` must remove both controllers, and no
# controller or nvme-subsystem may be left.
# Args: PORT NQN
# Env:  NVME_ADDR (default 10.0.2.2 = host 127.0.0.1), MIXED_MIB (size of each
#       pattern, default 8), MIXED_SEEK_MIB (offset of the first one, default 128),
#       NVME_MULTIPATH=0 (load nvme_core with multipath=N: per-path devices),
#       MIXED_IO_TIMEOUT (s, default 30: a dd that takes longer is a hang; the
#       scenario then prints controller, socket and QP state and fails),
#       NVME_QUEUES / NVME_EXTRA (as nvme-tcp, applied to both connects)
. /kp/lib.sh
A=${NVME_ADDR:-$KP_HOST} P=${1:-${NVME_PORT:-4420}} NQN=${2:-${NVME_NQN:-}}
[ -n "$NQN" ] || kp_die "usage: nvme-tcp-rdma PORT NQN"
MIB=${MIXED_MIB:-8} SEEK0=${MIXED_SEEK_MIB:-128} IO_TIMEOUT=${MIXED_IO_TIMEOUT:-30}
BS=262144 BPM=4 # dd block size 256 KiB: 4 blocks per MiB

# ------------------------------------------------------------------ helpers
# tr_ctrl TR : the controller (nvmeX) of NQN over transport TR, if any
tr_ctrl() {
	for _c in /sys/class/nvme/nvme*; do
		[ -e "$_c/subsysnqn" ] || continue
		[ "$(cat "$_c/subsysnqn")" = "$NQN" ] || continue
		[ "$(cat "$_c/transport")" = "$1" ] || continue
		basename "$_c"; return 0
	done
	return 1
}
ctrl_live() { [ "$(cat /sys/class/nvme/"$1"/state 2>/dev/null)" = live ]; }
ctrl_gone() { [ ! -e /sys/class/nvme/"$1" ]; }
# path_of CTRL : the namespace disk of CTRL: nvmeAcBnC (a hidden multipath
# path) or, without multipath, nvmeXnY
path_of() {
	for _n in /sys/class/nvme/"$1"/nvme*n*; do
		[ -e "$_n/stat" ] && { basename "$_n"; return 0; }
	done
	return 1
}
# head_of PATHDEV : the multipath head (nvmeAcBnC -> nvmeAnC)
head_of() { echo "$1" | sed 's/c[0-9]*n/n/'; }
# paths_of HEAD : the live controllers' path devices that belong to HEAD
paths_of() {
	for _c in /sys/class/nvme/nvme*; do
		_pc=$(basename "$_c")
		[ "$(cat "$_c/subsysnqn" 2>/dev/null)" = "$NQN" ] && ctrl_live "$_pc" || continue
		_pp=$(path_of "$_pc") || continue
		[ "$(head_of "$_pp")" = "$1" ] && printf '%s(%s) ' "$_pp" "$(cat "$_c/transport")"
	done
}
# sectors CTRL : "read-sectors write-sectors" of CTRL's namespace path
sectors() { awk '{print $3, $7}' /sys/class/nvme/"$1"/"$(path_of "$1")"/stat 2>/dev/null || echo "0 0"; }
# moved BEFORE AFTER FIELD : sectors moved on a path (FIELD 1 = read, 2 = write)
moved() { echo "$1 $2" | awk -v f="$3" '{print $(f + 2) - $f}'; }
# subsys_dir : the one nvme-subsystem for NQN
subsys_dir() {
	_sd=""
	for _s in /sys/class/nvme-subsystem/nvme-subsys*; do
		[ "$(cat "$_s/subsysnqn" 2>/dev/null)" = "$NQN" ] || continue
		[ -z "$_sd" ] || { echo "two"; return 1; }
		_sd=$_s
	done
	[ -n "$_sd" ] && echo "$_sd"
}

# disc_has TR : the discovery log in /tmp/kp-disc.txt lists NQN as an NVM
# subsystem with trtype TR
disc_has() {
	awk -v nqn="$NQN" -v tr="$1" '
		/^=====Discovery Log Entry/ {t = ""; st = ""}
		/^trtype:/ {t = $2}
		/^subtype:/ {sub(/^subtype:[ ]*/, ""); st = $0}
		/^subnqn:/ {if ($2 == nqn && t == tr && st == "nvme subsystem") found = 1}
		END {exit !found}' /tmp/kp-disc.txt
}
disc_summary() {
	awk '/^=====Discovery Log Entry/ {n++} /^trtype:/ {t[n] = $2} /^subnqn:/ {q[n] = $2}
	     /^traddr:/ {a[n] = $2} /^trsvcid:/ {s[n] = $2}
	     END {for (i = 1; i <= n; i++) printf "    entry %d: %-5s %s:%s %s\n", i - 1, t[i], a[i], s[i], q[i]}' /tmp/kp-disc.txt
}

# connect_tr TR : nvme connect -t TR, wait for a live controller with a
# namespace; sets C_TCP or C_RDMA
connect_tr() {
	kp_step "connect -t $1 $A:$P $NQN"
	tr_ctrl "$1" >/dev/null && kp_die "a $1 controller for $NQN exists already: $(tr_ctrl "$1")"
	# shellcheck disable=SC2046
	kp_must nvme connect $(kp_nvme_connect_args "$1" "$A" "$P" "$NQN")
	kp_wait 20 tr_ctrl "$1" || kp_die "no $1 controller for $NQN appeared"
	_cc=$(tr_ctrl "$1")
	kp_wait 20 ctrl_live "$_cc" || kp_die "$1 controller $_cc is not live (state $(cat /sys/class/nvme/$_cc/state))"
	kp_wait 20 path_of "$_cc" || { ls -l /sys/class/nvme/"$_cc"/; kp_die "no namespace behind $1 controller $_cc"; }
	kp_log "controller $_cc: transport=$1 cntlid=$(cat /sys/class/nvme/$_cc/cntlid) address=$(tr '\n' ' ' < /sys/class/nvme/$_cc/address) state=live path=$(path_of "$_cc")"
	if [ "$1" = tcp ]; then C_TCP=$_cc; else C_RDMA=$_cc; fi
	if [ "$MP" = Y ]; then
		_h=$(head_of "$(path_of "$_cc")")
		case "$(path_of "$_cc")" in *c*n*) ;; *) kp_die "multipath is on, but $_cc has no hidden path device ($(path_of "$_cc"))" ;; esac
		[ -z "$HEAD" ] || [ "$_h" = "$HEAD" ] || kp_die "the $1 path of $_cc belongs to $_h, not to $HEAD"
		kp_wait 10 test -b /dev/"$_h" || kp_die "no multipath head /dev/$_h for $(path_of "$_cc")"
	fi
}

# disconnect_ctrl CTRL WHAT : nvme disconnect -d CTRL, wait until it is gone
disconnect_ctrl() {
	kp_must nvme disconnect -d "$1"
	kp_wait 15 ctrl_gone "$1" || kp_die "$2 controller $1 still present after nvme disconnect -d $1"
	kp_log "$2 controller $1 gone"
}

# check_subsys : ONE nvme-subsystem for NQN, with exactly two live
# controllers, one tcp and one rdma, with different cntlids
check_subsys() {
	SS=$(subsys_dir) || kp_die "$NQN is split over more than one nvme-subsystem: $(ls /sys/class/nvme-subsystem)"
	[ -n "$SS" ] || kp_die "no nvme-subsystem for $NQN"
	_live=0 _trs="" _ids=""
	for _c in "$SS"/nvme*; do
		_b=$(basename "$_c")
		case "$_b" in nvme*n*) continue ;; esac   # the multipath head disk
		[ -e "$_c/transport" ] || continue
		_t=$(cat "$_c/transport") _st=$(cat "$_c/state") _id=$(cat "$_c/cntlid")
		kp_log "  $(basename "$SS")/$_b: transport=$_t cntlid=$_id state=$_st"
		[ "$_st" = live ] || continue
		_live=$((_live + 1)) _trs="$_trs $_t" _ids="$_ids $_id"
	done
	[ "$_live" = 2 ] || kp_die "$(basename "$SS") has $_live live controllers, expected 2"
	case "$_trs" in *tcp*rdma*|*rdma*tcp*) ;; *) kp_die "live controllers are over$_trs, expected tcp and rdma" ;; esac
	set -- $_ids
	[ "$1" != "$2" ] || kp_die "both controllers have cntlid $1"
	kp_log "$(basename "$SS"): 2 live controllers for $NQN (transports$_trs, cntlids$_ids)"
}

# io_stall WHAT : an I/O hangs: show the controllers, the TCP sockets (siw's
# included: Recv-Q/Send-Q say which side stopped reading) and the QPs, then
# fail; /init prints the dmesg tail. The hung dd stays behind in D state.
io_stall() {
	echo "[kp $(kp_uptime)] STALL: $1 not done after ${IO_TIMEOUT}s; state:"
	for _c in /sys/class/nvme/nvme*; do
		[ -e "$_c/transport" ] &&
			echo "  $(basename "$_c"): $(cat "$_c/transport") cntlid=$(cat "$_c/cntlid") state=$(cat "$_c/state")"
	done
	echo "  paths: $(paths_of "${HEAD:-none}")"
	netstat -tn 2>/dev/null
	rdma res show qp 2>/dev/null
	rdma res show cm_id 2>/dev/null
	# is it the target, or the guest's network (virtio-net / QEMU slirp)?
	# slirp answers pings to 10.0.2.2 itself; TX counters that do not move
	# while TCP retransmits mean the guest's eth0 stopped sending.
	echo "  eth0 tx/rx: $(sed -n 's/^ *eth0://p' /proc/net/dev | awk '{print "rx_pkts=" $2, "tx_pkts=" $10, "tx_drop=" $12}')"
	ping -c 2 -W 2 "$KP_HOST" 2>&1 | tail -n 2
	echo "  eth0 tx/rx: $(sed -n 's/^ *eth0://p' /proc/net/dev | awk '{print "rx_pkts=" $2, "tx_pkts=" $10, "tx_drop=" $12}')"
	tc -s qdisc show dev eth0 2>/dev/null | head -n 6
	kp_die "$1 hung (I/O not completed in ${IO_TIMEOUT}s)"
}
# io WHAT CMD... : run an I/O command with a deadline (IO_TIMEOUT s): a hung
# path fails the scenario with diagnostics instead of running into the VM limit
io() {
	_what=$1; shift
	echo "+ $*" >&2
	rm -f /tmp/io.rc
	( "$@" 2>/tmp/io.err; echo $? > /tmp/io.rc ) &
	_t=$((IO_TIMEOUT * 5))
	while [ ! -s /tmp/io.rc ]; do
		_t=$((_t - 1))
		[ "$_t" -gt 0 ] || io_stall "$_what"
		sleep 0.2
	done
	wait
	[ "$(cat /tmp/io.rc)" = 0 ] || { cat /tmp/io.err; kp_die "$_what failed (rc=$(cat /tmp/io.rc)): $*"; }
}
# pat_write DEV FILE SEEK_MIB / pat_read DEV SEEK_MIB OUT : O_DIRECT, bs=256k
pat_write() {
	io "write $2 to $1 at $3 MiB" dd if="$2" of="$1" bs=$BS count=$((MIB * BPM)) seek=$(($3 * BPM)) oflag=direct conv=fsync,notrunc
}
pat_read() {
	io "read $1 at $2 MiB" dd if="$1" of="$3" bs=$BS count=$((MIB * BPM)) skip=$(($2 * BPM)) iflag=direct
}
# pat_check DEV FILE SEEK_MIB WHAT : DEV at SEEK_MIB reads back as FILE
pat_check() {
	echo 3 > /proc/sys/vm/drop_caches
	pat_read "$1" "$3" /tmp/rb
	if ! cmp -s "$2" /tmp/rb; then
		cmp "$2" /tmp/rb | head -n 2
		cmp -l "$2" /tmp/rb | head -n 5
		kp_die "DATA MISMATCH: $4"
	fi
	rm -f /tmp/rb
	kp_log "data OK: $4 (sha256 $(sha256sum < "$2" | cut -c1-16)...)"
}
# path_moved CTRL BEFORE WHAT FIELD : I/O through the head went over CTRL
# (FIELD 1: read, 2: written sectors since BEFORE, from `sectors CTRL`)
path_moved() {
	_m=$(moved "$2" "$(sectors "$1")" "$4")
	kp_log "  $3: $_m sectors $( [ "$4" = 1 ] && echo read || echo written) through $1 ($(path_of "$1"))"
	[ "$_m" -gt 0 ] || kp_die "$3: no I/O went through $1"
}

# ------------------------------------------------------------------ setup
kp_siw_up eth0 || kp_die "cannot create siw0 on eth0"
if [ "${NVME_MULTIPATH:-}" = 0 ]; then
	kp_must modprobe nvme-core multipath=N
fi
kp_nvme_setup tcp || kp_die "cannot load nvme-tcp"
kp_nvme_setup rdma || kp_die "cannot load nvme-rdma"
MP=$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null || echo N)
kp_log "hostnqn=$(cat /etc/nvme/hostnqn) hostid=$(cat /etc/nvme/hostid) native multipath=$MP"
kp_run nvme version

kp_step "patterns: 3 x ${MIB} MiB at ${SEEK0} MiB"
SEEK1=$SEEK0 SEEK2=$((SEEK0 + MIB)) SEEK3=$((SEEK0 + 2 * MIB))
for _i in 1 2 3; do
	kp_must dd if=/dev/urandom of=/tmp/p$_i bs=1M count="$MIB" 2>/dev/null
	kp_log "pattern $_i sha256=$(sha256sum < /tmp/p$_i | cut -c1-16)..."
done
cmp -s /tmp/p1 /tmp/p2 && kp_die "patterns 1 and 2 are equal"

# ------------------------------------------------------------------ discovery
for TR in tcp rdma; do
	kp_nvme_discover "$TR" "$A" "$P" || kp_die "nvme discover -t $TR failed"
	disc_summary
	disc_has "$TR" || kp_die "the $TR discovery log does not list $NQN with trtype $TR"
	kp_log "$TR discovery log lists $NQN (trtype $TR)"
done
kp_wait 10 sh -c '[ -z "$(ls /sys/class/nvme/ 2>/dev/null)" ]' || kp_die "controllers left after discovery: $(ls /sys/class/nvme/)"

# ------------------------------------------------------------------ connect both
HEAD=""
connect_tr tcp
[ "$MP" = Y ] && HEAD=$(head_of "$(path_of "$C_TCP")")
connect_tr rdma

kp_step "one subsystem, two controllers"
check_subsys
kp_run nvme list-subsys
kp_run nvme list

if [ "$MP" = Y ]; then
	# --------------------------------------------------------- native multipath
	[ -b /dev/"$HEAD" ] || kp_die "no multipath head /dev/$HEAD"
	[ -e "$SS/$HEAD" ] || kp_die "/dev/$HEAD is not a namespace of $(basename "$SS")"
	_np=$(paths_of "$HEAD" | wc -w)
	[ "$_np" = 2 ] || kp_die "/dev/$HEAD has $_np live paths, expected 2: $(paths_of "$HEAD")"
	kp_log "multipath head /dev/$HEAD of $(basename "$SS"): paths $(paths_of "$HEAD")$(( $(cat /sys/block/$HEAD/size) / 2048 )) MiB"
	[ $(( $(cat /sys/block/$HEAD/size) / 2048 )) -ge $((SEEK3 + MIB)) ] || kp_die "namespace too small for the patterns"
	DEV=/dev/$HEAD

	kp_step "both paths at once (iopolicy round-robin): pattern 1"
	if [ -w "$SS/iopolicy" ]; then
		echo round-robin > "$SS/iopolicy" || kp_die "cannot set iopolicy"
		kp_log "$(basename "$SS") iopolicy=$(cat "$SS/iopolicy")"
		RR=1
	else
		kp_log "(no iopolicy knob: the kernel picks one path)"
		RR=0
	fi
	ST0=$(sectors "$C_TCP") SR0=$(sectors "$C_RDMA")
	pat_write "$DEV" /tmp/p1 "$SEEK1"
	pat_check "$DEV" /tmp/p1 "$SEEK1" "pattern 1 written and read through /dev/$HEAD, both paths up"
	_tw=$(moved "$ST0" "$(sectors "$C_TCP")" 2) _rw=$(moved "$SR0" "$(sectors "$C_RDMA")" 2)
	_tr=$(moved "$ST0" "$(sectors "$C_TCP")" 1) _rr=$(moved "$SR0" "$(sectors "$C_RDMA")" 1)
	kp_log "  per path: tcp $C_TCP wrote $_tw / read $_tr sectors, rdma $C_RDMA wrote $_rw / read $_rr sectors"
	if [ "$RR" = 1 ]; then
		[ "$_tw" -gt 0 ] && [ "$_rw" -gt 0 ] || kp_die "round-robin: the writes did not use both paths"
		[ "$_tr" -gt 0 ] && [ "$_rr" -gt 0 ] || kp_die "round-robin: the reads did not use both paths"
		echo numa > "$SS/iopolicy"
	fi

	kp_step "TCP path only: disconnect the RDMA controller $C_RDMA"
	disconnect_ctrl "$C_RDMA" rdma
	[ -b "$DEV" ] || kp_die "$DEV vanished with one path left"
	[ "$(paths_of "$HEAD" | wc -w)" = 1 ] || kp_die "/dev/$HEAD should have one live path: $(paths_of "$HEAD")"
	kp_log "/dev/$HEAD still there, one path: $(paths_of "$HEAD")"
	ctrl_live "$C_TCP" || kp_die "tcp controller $C_TCP not live"
	S0=$(sectors "$C_TCP")
	pat_check "$DEV" /tmp/p1 "$SEEK1" "pattern 1 (written over both paths) read back over TCP"
	pat_write "$DEV" /tmp/p2 "$SEEK2"
	path_moved "$C_TCP" "$S0" "pattern 2 written over TCP" 2
	pat_check "$DEV" /tmp/p2 "$SEEK2" "pattern 2 written and read back over TCP"

	connect_tr rdma
	check_subsys

	kp_step "RDMA path only: disconnect the TCP controller $C_TCP"
	disconnect_ctrl "$C_TCP" tcp
	[ -b "$DEV" ] || kp_die "$DEV vanished with one path left"
	[ "$(paths_of "$HEAD" | wc -w)" = 1 ] || kp_die "/dev/$HEAD should have one live path: $(paths_of "$HEAD")"
	kp_log "/dev/$HEAD still there, one path: $(paths_of "$HEAD")"
	ctrl_live "$C_RDMA" || kp_die "rdma controller $C_RDMA not live"
	S0=$(sectors "$C_RDMA")
	pat_check "$DEV" /tmp/p2 "$SEEK2" "pattern 2 written over TCP, read back over RDMA"
	path_moved "$C_RDMA" "$S0" "pattern 2 read over RDMA" 1
	pat_check "$DEV" /tmp/p1 "$SEEK1" "pattern 1 read back over RDMA"
	S0=$(sectors "$C_RDMA")
	pat_write "$DEV" /tmp/p3 "$SEEK3"
	path_moved "$C_RDMA" "$S0" "pattern 3 written over RDMA" 2

	connect_tr tcp
	check_subsys

	kp_step "TCP path only again: disconnect the RDMA controller $C_RDMA"
	disconnect_ctrl "$C_RDMA" rdma
	[ -b "$DEV" ] || kp_die "$DEV vanished with one path left"
	S0=$(sectors "$C_TCP")
	pat_check "$DEV" /tmp/p3 "$SEEK3" "pattern 3 written over RDMA, read back over TCP"
	path_moved "$C_TCP" "$S0" "pattern 3 read over TCP" 1
	pat_check "$DEV" /tmp/p2 "$SEEK2" "pattern 2 read back over TCP"

	connect_tr rdma
	check_subsys
else
	# --------------------------------------------------------- one device per path
	DT=/dev/$(path_of "$C_TCP") DR=/dev/$(path_of "$C_RDMA")
	[ -b "$DT" ] && [ -b "$DR" ] || kp_die "no namespace devices ($DT, $DR)"
	[ "$DT" != "$DR" ] || kp_die "both controllers show the same device $DT"
	kp_log "no native multipath: tcp $C_TCP -> $DT, rdma $C_RDMA -> $DR"
	[ $(( $(cat /sys/block/${DT#/dev/}/size) / 2048 )) -ge $((SEEK3 + MIB)) ] || kp_die "namespace too small for the patterns"

	kp_step "write over TCP ($DT), read back over RDMA ($DR)"
	pat_write "$DT" /tmp/p1 "$SEEK1"
	pat_check "$DR" /tmp/p1 "$SEEK1" "pattern 1 written over TCP, read back over RDMA"
	pat_check "$DT" /tmp/p1 "$SEEK1" "pattern 1 read back over TCP"

	kp_step "write over RDMA ($DR), read back over TCP ($DT)"
	pat_write "$DR" /tmp/p2 "$SEEK2"
	pat_check "$DT" /tmp/p2 "$SEEK2" "pattern 2 written over RDMA, read back over TCP"
	pat_check "$DR" /tmp/p2 "$SEEK2" "pattern 2 read back over RDMA"

	kp_step "TCP only: disconnect the RDMA controller $C_RDMA"
	disconnect_ctrl "$C_RDMA" rdma
	ctrl_live "$C_TCP" || kp_die "tcp controller $C_TCP not live"
	pat_write "$DT" /tmp/p3 "$SEEK3"
	pat_check "$DT" /tmp/p2 "$SEEK2" "pattern 2 read back over TCP with RDMA gone"

	connect_tr rdma
	check_subsys
	DR=/dev/$(path_of "$C_RDMA")
	pat_check "$DR" /tmp/p3 "$SEEK3" "pattern 3 written over TCP (RDMA gone), read back over the new RDMA controller"
fi

# ------------------------------------------------------------------ teardown
kp_step "disconnect everything ($NQN)"
echo "+ nvme disconnect -n $NQN"
nvme disconnect -n "$NQN" > /tmp/disc.out 2>&1 || { cat /tmp/disc.out; kp_die "nvme disconnect -n $NQN failed"; }
cat /tmp/disc.out
grep -q 'disconnected 2 controller' /tmp/disc.out || kp_die "nvme disconnect -n did not remove 2 controllers"
kp_wait 15 ctrl_gone "$C_TCP" || kp_die "tcp controller $C_TCP still present"
kp_wait 15 ctrl_gone "$C_RDMA" || kp_die "rdma controller $C_RDMA still present"
kp_wait 10 sh -c '[ -z "$(ls /sys/class/nvme/ 2>/dev/null)" ]' || kp_die "controllers left: $(ls /sys/class/nvme/)"
kp_wait 10 sh -c '[ -z "$(ls /sys/class/nvme-subsystem/ 2>/dev/null)" ]' || kp_die "nvme-subsystems left: $(ls /sys/class/nvme-subsystem/)"
[ -z "$(ls /dev/ | grep -E '^nvme[0-9]+n[0-9]+$')" ] || kp_die "namespace devices left: $(ls /dev/ | grep -E '^nvme[0-9]+n[0-9]+$')"
kp_log "no controller, subsystem or namespace left"
rm -f /tmp/p1 /tmp/p2 /tmp/p3
kp_log "nvme-tcp-rdma PASSED: TCP and RDMA controllers on one subsystem ($A:$P $NQN, multipath=$MP), data crossed both ways"
