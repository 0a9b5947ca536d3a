#!/bin/sh
# 64 MiB pattern test: connect, write a 64 MiB random pattern (every block
# different, kept in guest RAM) to the namespace with O_DIRECT 1 MiB writes,
# drop caches, read it back with O_DIRECT (1 MiB and 128 KiB reads), compare
# checksums, disconnect.
# Args: [PORT] [NQN]  (NQN default: first NVM subsystem in the discovery log)
# Env:  NVME_TRANSPORT (tcp|rdma), NVME_ADDR, NVME_DIGEST=1, NVME_QUEUES=N, NVME_EXTRA, PATTERN_MIB (64),
#       PATTERN_SEEK_MIB (1: offset of the pattern on the namespace),
#       PATTERN_FILE (use this file, e.g. copied in with -f, instead of /dev/urandom),
#       PATTERN_SHA256 (expected sha256 of the pattern, computed on the host)
. /kp/lib.sh
TR=${NVME_TRANSPORT:-tcp}  # tcp, or rdma: NVMe/RDMA over soft-iWARP (siw0 on eth0)
A=${NVME_ADDR:-$KP_HOST} P=${1:-${NVME_PORT:-4420}} NQN=${2:-${NVME_NQN:-}}
MIB=${PATTERN_MIB:-64} SEEK=${PATTERN_SEEK_MIB:-1}

if [ "$TR" = rdma ]; then kp_siw_up eth0 || kp_die "cannot create siw0 on eth0"; fi
kp_nvme_setup "$TR" || kp_die "module setup failed"
kp_log "hostnqn=$(cat /etc/nvme/hostnqn)"
if [ -z "$NQN" ]; then
	kp_nvme_discover "$TR" "$A" "$P" || kp_die "nvme discover failed"
	NQN=$KP_DISC_NQN
	[ -n "$NQN" ] || kp_die "no NVM subsystem in discovery log"
fi

if [ -n "${PATTERN_FILE:-}" ]; then
	# a host-made pattern copied in with `kernel-peer run -f FILE:/kp/files/...`
	# (generating 64 MiB from /dev/urandom under TCG takes ~10 s)
	kp_step "pattern from $PATTERN_FILE (guest RAM)"
	[ -f "$PATTERN_FILE" ] || kp_die "$PATTERN_FILE missing"
	kp_must dd if="$PATTERN_FILE" of=/tmp/pat bs=1M count="$MIB" 2>/dev/null
	rm -f "$PATTERN_FILE"
	[ "$(wc -c < /tmp/pat)" = $((MIB * 1048576)) ] || kp_die "$PATTERN_FILE is smaller than ${MIB} MiB"
else
	kp_step "generate ${MIB} MiB pattern in guest RAM"
	kp_must dd if=/dev/urandom of=/tmp/pat bs=1M count="$MIB" 2>/dev/null
fi
# refuse a degenerate pattern (all zero / repeated blocks would hide misplaced I/O)
[ "$(md5sum < /tmp/pat | cut -d' ' -f1)" != "$(dd if=/dev/zero bs=1M count="$MIB" 2>/dev/null | md5sum | cut -d' ' -f1)" ] || kp_die "pattern is all zero"
[ "$(dd if=/tmp/pat bs=4096 count=1 2>/dev/null | md5sum)" != "$(dd if=/tmp/pat bs=4096 skip=1 count=1 2>/dev/null | md5sum)" ] || kp_die "pattern blocks repeat"
SUM=$(sha256sum < /tmp/pat | cut -d' ' -f1)
kp_log "pattern sha256=$SUM"
[ -z "${PATTERN_SHA256:-}" ] || [ "$PATTERN_SHA256" = "$SUM" ] || kp_die "pattern sha256 differs from the host's $PATTERN_SHA256"

kp_nvme_connect "$TR" "$A" "$P" "$NQN"
NS=$KP_NS CTRL=$KP_CTRL
SIZE_MIB=$(( $(cat /sys/block/${NS#/dev/}/size) / 2048 ))
[ "$SIZE_MIB" -ge $((MIB + SEEK)) ] || kp_die "namespace too small ($SIZE_MIB MiB) for ${MIB} MiB at ${SEEK} MiB"

kp_step "write ${MIB} MiB at ${SEEK} MiB (O_DIRECT, bs=1M)"
T0=$(kp_uptime)
kp_must dd if=/tmp/pat of="$NS" bs=1M count="$MIB" seek="$SEEK" oflag=direct conv=fsync,notrunc
kp_log "written in $(awk -v a="$T0" -v b="$(kp_uptime)" 'BEGIN{printf "%.1f", b-a}') s (guest time)"
kp_must nvme flush "$NS"
sync
echo 3 > /proc/sys/vm/drop_caches

kp_step "read back (O_DIRECT, bs=1M) and compare"
kp_must dd if="$NS" of=/tmp/rb bs=1M count="$MIB" skip="$SEEK" iflag=direct
RB=$(sha256sum < /tmp/rb | cut -d' ' -f1)
kp_log "read-back sha256=$RB"
if [ "$RB" != "$SUM" ]; then
	cmp /tmp/pat /tmp/rb | head -n 3
	cmp -l /tmp/pat /tmp/rb | head -n 5
	kp_die "DATA MISMATCH (1 MiB reads)"
fi
rm -f /tmp/rb
echo 3 > /proc/sys/vm/drop_caches

kp_step "read back again (O_DIRECT, bs=128k) and compare"
RB2=$(dd if="$NS" bs=128k count=$((MIB * 8)) skip=$((SEEK * 8)) iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
kp_log "read-back sha256=$RB2"
[ "$RB2" = "$SUM" ] || kp_die "DATA MISMATCH (128 KiB reads)"
rm -f /tmp/pat

kp_nvme_disconnect "$NQN" "$CTRL"
kp_log "nvme-pattern PASSED: ${MIB} MiB written and read back intact ($A:$P $NQN)"
