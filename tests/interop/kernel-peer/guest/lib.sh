# kernel-peer guest helper library (busybox sh). Sourced by /init; scenario
# scripts run as a child `sh /kp/scenario.sh` and should `. /kp/lib.sh` too.
#
# Conventions: kp_run prints and runs a command (returns its status),
# kp_must does the same but fails the scenario on error, kp_die fails it.

KP_HOST=${KP_HOST:-10.0.2.2}          # the QEMU host (its 127.0.0.1) as seen from the guest
KP_GUEST_IP=${KP_GUEST_IP:-10.0.2.15}

kp_uptime() { cut -d' ' -f1 /proc/uptime; }
kp_log() { echo "[kp $(kp_uptime)] $*"; }
kp_die() { echo "[kp $(kp_uptime)] FAIL: $*"; exit 1; }
kp_run() { echo "+ $*" >&2; "$@"; }
kp_must() {
	echo "+ $*" >&2
	"$@" || kp_die "command failed (rc=$?): $*"
}
kp_step() { echo; echo "=== [$(kp_uptime)] $* ==="; }

# kp_wait SECONDS CMD... : poll CMD every 0.2 s until it succeeds.
kp_wait() {
	_t=$(( $1 * 5 )); shift
	while [ "$_t" -gt 0 ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2; _t=$((_t - 1))
	done
	return 1
}

kp_modprobe() {
	for _m in "$@"; do
		modprobe "$_m" || { echo "[kp] modprobe $_m failed"; return 1; }
	done
}

# kp_dyndbg : enable pr_debug/dynamic debug for the (loaded) modules listed in
# KP_DYNDBG_MODULES (e.g. -e KP_DYNDBG_MODULES="siw nvme_rdma nvmet_rdma")
# and raise the console log level so the messages show.
kp_dyndbg() {
	[ -n "${KP_DYNDBG_MODULES:-}" ] || return 0
	for _m in $KP_DYNDBG_MODULES; do
		echo "module $_m +p" > /proc/dynamic_debug/control 2>/dev/null
	done
	dmesg -n 8
}

# Called by /init before the scenario.
kp_base_setup() {
	kp_modprobe configfs && mount -t configfs configfs /sys/kernel/config
	kp_modprobe virtio_pci virtio_net || return 1
	ip link set lo up
	kp_wait 10 test -e /sys/class/net/eth0 || { echo "[kp] no eth0"; return 1; }
	ip link set eth0 up
	ip addr add "$KP_GUEST_IP/24" dev eth0
	ip route add default via "$KP_HOST"
	# Host-side identities; override with KP_HOSTNQN / KP_HOSTID / KP_ISCSI_INITIATOR.
	mkdir -p /etc/nvme
	if [ -n "${KP_HOSTID:-}" ]; then _id=$KP_HOSTID; else _id=$(cat /proc/sys/kernel/random/uuid); fi
	echo "${KP_HOSTNQN:-nqn.2014-08.org.nvmexpress:uuid:$_id}" > /etc/nvme/hostnqn
	echo "$_id" > /etc/nvme/hostid
	return 0
}

# ---------------------------------------------------------------- data checks
# kp_pattern_check DEV BS COUNT SEEK : write COUNT blocks of BS bytes of random
# data at block offset SEEK with O_DIRECT (+fsync), read them back with
# O_DIRECT and compare byte for byte.
kp_pattern_check() {
	_dev=$1 _bs=$2 _cnt=$3 _seek=${4:-0}
	dd if=/dev/urandom of=/tmp/kp-pat bs="$_bs" count="$_cnt" 2>/dev/null || return 1
	echo "+ [$(kp_uptime)] write $_cnt x $_bs at block $_seek of $_dev (O_DIRECT)"
	dd if=/tmp/kp-pat of="$_dev" bs="$_bs" count="$_cnt" seek="$_seek" oflag=direct conv=fsync,notrunc 2>/tmp/kp-dd.err \
		|| { cat /tmp/kp-dd.err; echo "[kp] write failed"; return 1; }
	echo 3 > /proc/sys/vm/drop_caches
	dd if="$_dev" of=/tmp/kp-rb bs="$_bs" count="$_cnt" skip="$_seek" iflag=direct 2>/tmp/kp-dd.err \
		|| { cat /tmp/kp-dd.err; echo "[kp] read failed"; return 1; }
	if cmp /tmp/kp-pat /tmp/kp-rb; then
		echo "  [$(kp_uptime)] data OK sha256=$(sha256sum < /tmp/kp-pat | cut -c1-16)..."
		rm -f /tmp/kp-pat /tmp/kp-rb
		return 0
	fi
	echo "[kp] DATA MISMATCH on $_dev (bs=$_bs count=$_cnt seek=$_seek)"
	cmp -l /tmp/kp-pat /tmp/kp-rb | head -5
	return 1
}

# kp_golden_read_only DEV : DEV is marked read-only, its first GOLDEN_MIB
# MiB hash to GOLDEN_SHA256, and a write through the block layer fails.
kp_golden_read_only() {
	_ro=$(cat /sys/block/"${1#/dev/}"/ro)
	[ "$_ro" = 1 ] || kp_die "the kernel did not mark $1 read-only (ro=$_ro)"
	kp_log "$1 is read-only (ro=1)"
	kp_step "read the golden image"
	_sum=$(dd if="$1" bs=1M count="${GOLDEN_MIB:-16}" iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
	[ "$_sum" = "$GOLDEN_SHA256" ] || kp_die "read $_sum, expected $GOLDEN_SHA256"
	kp_log "sha256 of the first ${GOLDEN_MIB:-16} MiB matches"
	kp_step "a block-layer write is refused"
	if dd if=/dev/zero of="$1" bs=4096 count=1 oflag=direct 2>/tmp/kp-dd.txt; then
		kp_die "a block-layer write to $1 succeeded"
	fi
	cat /tmp/kp-dd.txt
}

# kp_zero_check DEV OFFSET_BYTES LEN_BYTES : the range reads back as zeroes.
# (O_DIRECT reads in units of the device's logical block size.)
kp_zero_check() {
	_zb=$(kp_lbs "$1")
	dd if=/dev/zero of=/tmp/kp-z bs="$3" count=1 2>/dev/null
	dd if="$1" of=/tmp/kp-rz bs="$_zb" skip=$(($2 / _zb)) count=$(($3 / _zb)) iflag=direct 2>/dev/null || return 1
	cmp /tmp/kp-z /tmp/kp-rz
}

# kp_lbs /dev/X : logical block size of a block device.
kp_lbs() { cat /sys/block/"${1#/dev/}"/queue/logical_block_size; }

# Standard battery: small, medium, large and unaligned-offset I/O. The last
# step uses single logical blocks (512 B, or 4 KiB on a 4K-LBA namespace,
# where 512-byte O_DIRECT I/O is impossible) at an odd block offset.
kp_data_battery() {
	_d=$1
	_lb=$(kp_lbs "$_d")
	kp_pattern_check "$_d" 4096 1 0       || return 1
	kp_pattern_check "$_d" 4096 16 257    || return 1
	kp_pattern_check "$_d" 65536 8 33     || return 1
	kp_pattern_check "$_d" 1048576 4 3    || return 1
	kp_pattern_check "$_d" "$_lb" 7 4099  || return 1
}

# kp_fio_verified RC MIB : fio's exit status RC and its output
# (/tmp/fio.out, normal + terse; stderr in /tmp/fio.err) show a clean run
# that wrote MIB MiB and read all of it back verified.
kp_fio_verified() {
	grep -v '^3;' /tmp/fio.out
	[ -s /tmp/fio.err ] && { echo "--- fio stderr"; cat /tmp/fio.err; }
	[ "$1" = 124 ] && kp_die "fio did not finish in time"
	[ "$1" = 0 ] || kp_die "fio failed (rc=$1)"
	# terse v3: field 5 error, 6 KiB read, 47 KiB written
	_terse=$(grep '^3;' /tmp/fio.out | head -n 1)
	[ -n "$_terse" ] || kp_die "no terse line in fio's output"
	_err=$(echo "$_terse" | awk -F';' '{print $5}')
	_rkb=$(echo "$_terse" | awk -F';' '{print $6}')
	_wkb=$(echo "$_terse" | awk -F';' '{print $47}')
	kp_log "fio: error=$_err written=${_wkb} KiB verified (read back)=${_rkb} KiB"
	[ "$_err" = 0 ] || kp_die "fio reported error $_err"
	grep -qiE 'verify.*(fail|mismatch)|bad (magic|header)' /tmp/fio.out /tmp/fio.err && kp_die "fio reported a verify failure"
	[ "$_wkb" = $(($2 * 1024)) ] || kp_die "fio wrote $_wkb KiB, expected $(($2 * 1024))"
	[ "$_rkb" = "$_wkb" ] || kp_die "fio's verify pass read $_rkb KiB of the $_wkb KiB written"
}

# kp_fio_through_events DEV NAME WHAT : starts fio (job NAME) writing
# ${FIO_SIZE:-64} MiB to DEV at ${FIO_RATE:-4} MiB/s with crc32c verify
# (sets FIO, its PID, and T0), then asks the host-side runner for each
# event in turn (KP-DROP-NOW, KP-RESTART-NOW, KP-KILL-NOW) and waits for
# WHAT (a controller or session, for the messages) to go (`gone`), come
# back (`back`, reported with `state`), and take writes again
# (`written`: sectors written). The scenario defines those four.
kp_fio_through_events() {
	kp_step "fio: randwrite, ${FIO_SIZE:-64} MiB, crc32c verify, while the target restarts and is killed"
	T0=$(kp_uptime)
	echo "+ fio --name=$2 --filename=$1 ... --rate=${FIO_RATE:-4}m --verify=crc32c"
	timeout "${FIO_TIMEOUT:-240}" fio --name="$2" --filename="$1" --direct=1 --ioengine=libaio \
		--iodepth=16 --rw=randwrite --bssplit=4k/40:16k/20:64k/20:128k/20 --size="${FIO_SIZE:-64}M" --offset=1M \
		--rate="${FIO_RATE:-4}m" \
		--verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=1 \
		--output-format=normal,terse --output=/tmp/fio.out > /tmp/fio.err 2>&1 &
	FIO=$!
	_w0=$(written)
	kp_wait 60 kp_written_over $((_w0 + 2048)) || kp_die "fio wrote nothing in 60 s"
	for _ev in DROP RESTART KILL; do
		kill -0 "$FIO" 2>/dev/null || kp_die "fio ended before the $_ev: the run would test nothing (lower FIO_RATE)"
		_before=$(written)
		kp_log "$((_before - _w0)) sectors written; asking the runner to $_ev the target"
		echo "KP-$_ev-NOW"
		kp_wait 60 gone || kp_die "$3 stayed $(state) after the target's $_ev"
		kp_log "$3 is $(state)"
		kp_wait 90 back || kp_die "$3 did not come back after the $_ev (state $(state))"
		kp_log "$3 $(state) again"
		kp_wait 60 kp_written_over $((_before + 2048)) ||
			kp_die "no writes went through after $3 came back (fio in its verify pass already? lower FIO_RATE)"
	done
}
kp_written_over() { [ "$(written)" -gt "$1" ]; }

# ---------------------------------------------------------------- NVMe-oF host
kp_nvme_setup() {
	kp_modprobe nvme-core nvme-fabrics crc32c_generic || return 1
	modprobe crc32c-intel 2>/dev/null
	case "$1" in
	tcp) kp_modprobe nvme-tcp || return 1 ;;
	rdma) kp_modprobe nvme-rdma || return 1 ;;
	esac
	kp_dyndbg
}

# kp_siw_up [NETDEV] : soft-iWARP device on top of eth0 (needs siw.ko, built
# out of tree by `kernel-peer prepare` because Debian does not enable RDMA_SIW).
kp_siw_up() {
	_nd=${1:-eth0}
	kp_modprobe ib_core ib_uverbs rdma_cm iw_cm siw || return 1
	kp_must rdma link add siw0 type siw netdev "$_nd"
	kp_run rdma link show
	kp_dyndbg
}

# Print the discovered NVM subsystem NQNs (not discovery subsystems) from
# `nvme discover` output on stdin.
kp_nvme_disc_subnqns() {
	awk '/^subtype:/ {sub(/^subtype:[ ]*/, ""); st=$0}
	     /^subnqn:/ {if (st == "nvme subsystem") print $2}'
}

# kp_nvme_ctrl_for NQN : controller name (nvmeX) connected to NQN, if any.
kp_nvme_ctrl_for() {
	for _c in /sys/class/nvme/nvme*; do
		[ -e "$_c/subsysnqn" ] || continue
		[ "$(cat "$_c/subsysnqn")" = "$1" ] && { basename "$_c"; return 0; }
	done
	return 1
}

# kp_nvme_ns_for CTRL : first namespace block device (/dev/nvmeXnY) behind the
# controller; works with and without native multipath.
kp_nvme_ns_for() {
	for _n in /sys/class/nvme/"$1"/nvme*; do
		_b=$(basename "$_n")
		case "$_b" in
		*c*n*) # multipath path device nvmeAcBnC -> head nvmeAnC
			_h=$(echo "$_b" | sed 's/c[0-9]*n/n/'); [ -b "/dev/$_h" ] && { echo "/dev/$_h"; return 0; } ;;
		*n*) [ -b "/dev/$_b" ] && { echo "/dev/$_b"; return 0; } ;;
		esac
	done
	return 1
}

# kp_nvme_discover TR ADDR PORT : `nvme discover`, output kept in /tmp/kp-disc.txt;
# sets KP_DISC_NQN to the first NVM subsystem of the discovery log.
kp_nvme_discover() {
	kp_step "discover $1 $2:$3"
	echo "+ nvme discover -t $1 -a $2 -s $3"
	nvme discover -t "$1" -a "$2" -s "$3" > /tmp/kp-disc.txt 2>&1
	_rc=$?
	cat /tmp/kp-disc.txt
	[ "$_rc" = 0 ] || { echo "[kp] nvme discover failed rc=$_rc"; return 1; }
	KP_DISC_NQN=$(kp_nvme_disc_subnqns < /tmp/kp-disc.txt | head -n1)
	return 0
}

# kp_nvme_connect_args TR ADDR PORT NQN : prints the `nvme connect` arguments,
# honouring NVME_DIGEST=1, NVME_QUEUES=N and NVME_EXTRA.
kp_nvme_connect_args() {
	_ca="-t $1 -a $2 -s $3 -n $4"
	[ "${NVME_DIGEST:-0}" = 1 ] && _ca="$_ca --hdr-digest --data-digest"
	[ -n "${NVME_QUEUES:-}" ] && _ca="$_ca -i $NVME_QUEUES"
	[ -n "${NVME_EXTRA:-}" ] && _ca="$_ca $NVME_EXTRA"
	echo "$_ca"
}

# kp_nvme_connect TR ADDR PORT NQN : connect and wait for the controller and
# its namespace; sets KP_CTRL (nvmeX) and KP_NS (/dev/nvmeXnY).
kp_nvme_connect() {
	kp_step "connect $4"
	# shellcheck disable=SC2046
	kp_must nvme connect $(kp_nvme_connect_args "$1" "$2" "$3" "$4")
	kp_wait 20 kp_nvme_ctrl_for "$4" || kp_die "controller for $4 did not appear"
	KP_CTRL=$(kp_nvme_ctrl_for "$4")
	kp_log "controller $KP_CTRL: transport=$(cat /sys/class/nvme/$KP_CTRL/transport) address=$(cat /sys/class/nvme/$KP_CTRL/address | tr '\n' ' ') state=$(cat /sys/class/nvme/$KP_CTRL/state)"
	kp_wait 20 kp_nvme_ns_for "$KP_CTRL" || { ls -l /sys/class/nvme/$KP_CTRL/ /dev/nvme*; kp_die "no namespace block device"; }
	KP_NS=$(kp_nvme_ns_for "$KP_CTRL")
	_nr_q=$(ls -d /sys/class/nvme/"$KP_CTRL"/nvme*/mq/[0-9]* /sys/block/"${KP_NS#/dev/}"/mq/[0-9]* 2>/dev/null | wc -l)
	kp_log "namespace $KP_NS size=$(( $(cat /sys/block/${KP_NS#/dev/}/size) / 2048 )) MiB lbs=$(cat /sys/block/${KP_NS#/dev/}/queue/logical_block_size) blk-mq hw queues=$_nr_q"
}

# kp_nvme_disconnect NQN CTRL : disconnect, and check that the controller is gone.
kp_nvme_disconnect() {
	kp_step "disconnect $1"
	kp_must nvme disconnect -n "$1"
	kp_wait 10 sh -c "! ls /sys/class/nvme/$2 >/dev/null 2>&1" || kp_die "controller $2 still present after disconnect"
	kp_log "controller $2 gone"
}

# kp_nvme_e2e TRANSPORT ADDR PORT [NQN] : the full NVMe-oF initiator battery.
# Env: NVME_DIGEST=1 (header+data digest), NVME_QUEUES=N (-i), NVME_EXTRA="..."
# (more nvme connect args), NVME_SKIP_DISCOVERY=1, NVME_KEEP=1 (stay connected),
# NVME_REQUIRE_DISCOVERED=1 (the NQN given must be in the discovery log).
kp_nvme_e2e() {
	_tr=$1 _a=$2 _p=$3 _nqn=${4:-}
	kp_nvme_setup "$_tr" || return 1
	kp_log "hostnqn=$(cat /etc/nvme/hostnqn)"
	kp_run nvme version

	if [ "${NVME_SKIP_DISCOVERY:-0}" != 1 ]; then
		kp_nvme_discover "$_tr" "$_a" "$_p" || kp_die "nvme discover failed"
		if [ -z "$_nqn" ]; then
			_nqn=$KP_DISC_NQN
			[ -n "$_nqn" ] || kp_die "no NVM subsystem in discovery log"
			kp_log "using first discovered subsystem $_nqn"
		fi
	fi
	[ -n "$_nqn" ] || kp_die "no NQN given"
	if [ "${NVME_REQUIRE_DISCOVERED:-0}" = 1 ]; then
		kp_nvme_disc_subnqns < /tmp/kp-disc.txt | grep -qxF "$_nqn" || kp_die "$_nqn is not in the discovery log"
		kp_log "$_nqn is in the discovery log"
	fi

	kp_nvme_connect "$_tr" "$_a" "$_p" "$_nqn"
	_ctrl=$KP_CTRL _ns=$KP_NS

	kp_step "identify"
	kp_must nvme list
	kp_run nvme list-subsys
	kp_must nvme id-ctrl /dev/"$_ctrl" > /tmp/kp-idctrl.txt
	grep -E '^(vid|sn|mn|fr|mdts|cntlid|ver|oncs|vwc|nn|sgls|subnqn|ioccsz|iorcsz|maxcmd|kas|cmic) ' /tmp/kp-idctrl.txt
	kp_must nvme id-ns "$_ns" > /tmp/kp-idns.txt
	grep -E '^(nsze|ncap|nuse|nsfeat|nlbaf|flbas|dlfeat|nguid|eui64|lbaf  0)' /tmp/kp-idns.txt
	kp_run nvme smart-log /dev/"$_ctrl" > /tmp/kp-smart.txt 2>&1 && head -n 4 /tmp/kp-smart.txt || kp_log "(smart-log not supported)"
	if [ -n "${NVME_QUEUES:-}" ]; then
		# The host makes min(-i, online CPUs) I/O queues; each is a blk-mq
		# hardware context of the namespace.
		_cpus=$(grep -c ^processor /proc/cpuinfo)
		_want=$NVME_QUEUES
		[ "$_cpus" -lt "$_want" ] && _want=$_cpus
		_hctx=$(dmesg | sed -n 's/.*creating \([0-9]*\) I\/O queues.*/\1/p' | tail -n 1)
		[ -n "$_hctx" ] || _hctx=0
		kp_log "I/O queues: the host created $_hctx (asked -i $NVME_QUEUES on $_cpus CPUs)"
		[ "$_hctx" -ge "$_want" ] || kp_die "expected at least $_want I/O queues, found $_hctx"
	fi

	kp_step "data integrity (O_DIRECT write / read back / compare)"
	kp_data_battery "$_ns" || kp_die "data battery failed on $_ns"

	kp_step "flush"
	kp_must nvme flush "$_ns"

	_oncs=$(awk '/^oncs /{print $3}' /tmp/kp-idctrl.txt)
	[ -n "$_oncs" ] || _oncs=0
	if [ $((_oncs & 4)) != 0 ]; then
		kp_step "dataset management (deallocate / TRIM)"
		kp_must nvme dsm "$_ns" --ad -s 0 -b 8
		if [ "${NVME_STRICT_DISCARD:-0}" = 1 ]; then
			kp_must blkdiscard -o 1048576 -l 1048576 "$_ns"
		else
			kp_run blkdiscard -o 1048576 -l 1048576 "$_ns" || kp_log "(kernel discard path failed or unsupported)"
		fi
	else
		kp_log "DSM not advertised (ONCS=$_oncs), skipping trim"
	fi
	if [ $((_oncs & 8)) != 0 ]; then
		kp_step "write zeroes"
		_lbs=$(cat /sys/block/"${_ns#/dev/}"/queue/logical_block_size)
		kp_pattern_check "$_ns" 4096 4 64 || kp_die "pre-write failed"
		# zero 16 KiB at byte offset 256 KiB (0-based NLB in -c)
		kp_must nvme write-zeroes "$_ns" -s $((262144 / _lbs)) -c $((16384 / _lbs - 1))
		echo 3 > /proc/sys/vm/drop_caches
		kp_zero_check "$_ns" 262144 16384 || kp_die "range not zero after write-zeroes"
		kp_log "write-zeroes range reads back as zeroes"
	else
		kp_log "Write Zeroes not advertised (ONCS=$_oncs), skipping"
	fi

	if [ "${NVME_KEEP:-0}" = 1 ]; then
		NVME_E2E_NQN=$_nqn NVME_E2E_DEV=$_ns NVME_E2E_CTRL=$_ctrl
		return 0
	fi
	kp_nvme_disconnect "$_nqn" "$_ctrl"
	kp_log "NVMe/$_tr e2e PASSED against $_a:$_p $_nqn"
	return 0
}

# ---------------------------------------------------------------- iSCSI host
kp_iscsi_setup() {
	kp_modprobe scsi_transport_iscsi libiscsi libiscsi_tcp iscsi_tcp sd_mod crc32c_generic || return 1
	mkdir -p /etc/iscsi/nodes /etc/iscsi/send_targets /etc/iscsi/ifaces /etc/iscsi/isns /etc/iscsi/static /run/lock/iscsi
	echo "InitiatorName=${KP_ISCSI_INITIATOR:-iqn.2024-01.org.kernel-peer:initiator}" > /etc/iscsi/initiatorname.iscsi
	if [ ! -e /run/iscsid.pid ]; then
		iscsid || return 1
		kp_wait 10 test -s /run/iscsid.pid || { echo "[kp] iscsid did not start"; return 1; }
	fi
	kp_log "iscsid running (pid $(cat /run/iscsid.pid)), $(cat /etc/iscsi/initiatorname.iscsi)"
}

# kp_iscsi_sd_for IQN : sdX of the first LUN of the logged-in session to IQN.
kp_iscsi_sd_for() {
	for _s in /sys/class/iscsi_session/session*; do
		[ "$(cat "$_s/targetname" 2>/dev/null)" = "$1" ] || continue
		for _b in "$_s"/device/target*/*/block/*; do
			[ -e "$_b" ] && { basename "$_b"; return 0; }
		done
	done
	return 1
}

# kp_iscsi_discover PORTAL [IQN] : SendTargets discovery; sets KP_ISCSI_IQN
# (IQN or the first discovered one) and makes sure a node record exists for
# IQN at PORTAL.  Targets advertise their own listening address (e.g.
# 127.0.0.1:3261), which is wrong behind QEMU's NAT, so a static record for
# the portal we actually reach is created when needed.
kp_iscsi_discover() {
	echo "+ iscsiadm -m discovery -t sendtargets -p $1"
	iscsiadm -m discovery -t sendtargets -p "$1" > /tmp/kp-disc.txt 2>&1
	_rc=$?
	cat /tmp/kp-disc.txt
	[ "$_rc" = 0 ] || { echo "[kp] discovery failed rc=$_rc"; return 1; }
	KP_ISCSI_IQN=${2:-}
	if [ -z "$KP_ISCSI_IQN" ]; then
		KP_ISCSI_IQN=$(awk '$2 ~ /^(iqn|eui|naa)\./ {print $2}' /tmp/kp-disc.txt | head -n1)
		[ -n "$KP_ISCSI_IQN" ] || { echo "[kp] no target discovered"; return 1; }
		kp_log "using first discovered target $KP_ISCSI_IQN"
	elif ! grep -q " $KP_ISCSI_IQN\$" /tmp/kp-disc.txt; then
		echo "[kp] target $KP_ISCSI_IQN not in the SendTargets response"; return 1
	fi
	_adv=$(awk -v t="$KP_ISCSI_IQN" '$2 == t {print $1}' /tmp/kp-disc.txt | head -n1)
	case "$_adv" in
	"$1",*) ;;
	*) kp_log "target advertises portal ${_adv%,*}; adding a static node record for $1 (QEMU NAT)"
	   iscsiadm -m node -o new -T "$KP_ISCSI_IQN" -p "$1" >/dev/null || return 1 ;;
	esac
	return 0
}

# kp_iscsi_node_set IQN PORTAL NAME VALUE
kp_iscsi_node_set() {
	kp_must iscsiadm -m node -T "$1" -p "$2" -o update -n "$3" -v "$4"
}

# kp_iscsi_e2e PORTAL [IQN] : discovery, login, data battery, logout.
# Env: ISCSI_CHAP_USER/ISCSI_CHAP_PASS (one-way CHAP), ISCSI_MUTUAL_USER/
# ISCSI_MUTUAL_PASS (target authenticates to us), ISCSI_KEEP=1.
kp_iscsi_e2e() {
	_portal=$1 _iqn=${2:-}
	kp_iscsi_setup || kp_die "iscsi setup failed"
	kp_step "discovery (SendTargets) $_portal"
	kp_iscsi_discover "$_portal" "$_iqn" || kp_die "discovery failed"
	_iqn=$KP_ISCSI_IQN
	if [ -n "${ISCSI_CHAP_USER:-}" ]; then
		kp_step "configure CHAP (user $ISCSI_CHAP_USER${ISCSI_MUTUAL_USER:+, mutual $ISCSI_MUTUAL_USER})"
		kp_iscsi_node_set "$_iqn" "$_portal" node.session.auth.authmethod CHAP
		kp_iscsi_node_set "$_iqn" "$_portal" node.session.auth.username "$ISCSI_CHAP_USER"
		kp_iscsi_node_set "$_iqn" "$_portal" node.session.auth.password "$ISCSI_CHAP_PASS"
		if [ -n "${ISCSI_MUTUAL_USER:-}" ]; then
			kp_iscsi_node_set "$_iqn" "$_portal" node.session.auth.username_in "$ISCSI_MUTUAL_USER"
			kp_iscsi_node_set "$_iqn" "$_portal" node.session.auth.password_in "$ISCSI_MUTUAL_PASS"
		fi
	fi
	if [ "${ISCSI_DIGEST:-0}" = 1 ]; then
		kp_iscsi_node_set "$_iqn" "$_portal" node.conn[0].iscsi.HeaderDigest CRC32C
		kp_iscsi_node_set "$_iqn" "$_portal" node.conn[0].iscsi.DataDigest CRC32C
	fi
	kp_step "login $_iqn"
	kp_must iscsiadm -m node -T "$_iqn" -p "$_portal" --login
	kp_run iscsiadm -m session -P 1 | grep -E 'Target:|Current Portal|SID|iSCSI Connection State|iSCSI Session State'
	kp_wait 20 kp_iscsi_sd_for "$_iqn" || { kp_run iscsiadm -m session -P 3; kp_die "no SCSI disk appeared"; }
	_sd=/dev/$(kp_iscsi_sd_for "$_iqn")
	kp_wait 10 test -b "$_sd" || kp_die "$_sd is not a block device"
	kp_log "disk $_sd size=$(( $(cat /sys/block/${_sd#/dev/}/size) / 2048 )) MiB vendor=$(cat /sys/block/${_sd#/dev/}/device/vendor) model=$(cat /sys/block/${_sd#/dev/}/device/model)"
	kp_run iscsiadm -m session -P 2 | grep -E 'HeaderDigest|DataDigest|MaxRecvDataSegmentLength|FirstBurstLength|MaxBurstLength|ImmediateData|InitialR2T|CHAP|username'

	kp_step "data integrity (O_DIRECT write / read back / compare)"
	kp_data_battery "$_sd" || kp_die "data battery failed on $_sd"

	if [ "${ISCSI_KEEP:-0}" = 1 ]; then
		ISCSI_E2E_IQN=$_iqn ISCSI_E2E_DEV=$_sd
		return 0
	fi
	kp_step "logout"
	kp_must iscsiadm -m node -T "$_iqn" -p "$_portal" --logout
	kp_wait 10 sh -c "! ls /sys/block/${_sd#/dev/} >/dev/null 2>&1" || kp_die "$_sd still present after logout"
	kp_log "iSCSI e2e PASSED against $_portal $_iqn"
}
