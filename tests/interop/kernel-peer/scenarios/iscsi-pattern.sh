#!/bin/sh
# 64 MiB pattern test over iSCSI: login (plus the short data battery), write a
# 64 MiB random pattern (every block different, kept in guest RAM) with
# O_DIRECT 1 MiB writes, sync, drop caches, read it back with O_DIRECT (1 MiB
# and 128 KiB reads), compare checksums, logout.
# Args: PORTAL IQN
# Env:  PATTERN_MIB (64), PATTERN_SEEK_MIB (1), PATTERN_FILE (use this file,
#       copied in with -f, instead of /dev/urandom), PATTERN_SHA256 (expected
#       sha256, computed on the host), plus ISCSI_DIGEST / ISCSI_CHAP_* of `iscsi`
. /kp/lib.sh
PORTAL=${1:-${ISCSI_PORTAL:-$KP_HOST:3260}}
IQN=${2:-${ISCSI_IQN:-}}
MIB=${PATTERN_MIB:-64} SEEK=${PATTERN_SEEK_MIB:-1}

if [ -n "${PATTERN_FILE:-}" ]; then
	kp_step "pattern from $PATTERN_FILE (guest RAM)"
	[ -f "$PATTERN_FILE" ] || kp_die "$PATTERN_FILE missing"
	kp_must dd if="$PATTERN_FILE" of=/tmp/pat bs=1M count="$MIB" 2>/dev/null
	rm -f "$PATTERN_FILE"
	[ "$(wc -c < /tmp/pat)" = $((MIB * 1048576)) ] || kp_die "$PATTERN_FILE is smaller than ${MIB} MiB"
else
	kp_step "generate ${MIB} MiB pattern in guest RAM"
	kp_must dd if=/dev/urandom of=/tmp/pat bs=1M count="$MIB" 2>/dev/null
fi
[ "$(md5sum < /tmp/pat | cut -d' ' -f1)" != "$(dd if=/dev/zero bs=1M count="$MIB" 2>/dev/null | md5sum | cut -d' ' -f1)" ] || kp_die "pattern is all zero"
[ "$(dd if=/tmp/pat bs=4096 count=1 2>/dev/null | md5sum)" != "$(dd if=/tmp/pat bs=4096 skip=1 count=1 2>/dev/null | md5sum)" ] || kp_die "pattern blocks repeat"
SUM=$(sha256sum < /tmp/pat | cut -d' ' -f1)
kp_log "pattern sha256=$SUM"
[ -z "${PATTERN_SHA256:-}" ] || [ "$PATTERN_SHA256" = "$SUM" ] || kp_die "pattern sha256 differs from the host's $PATTERN_SHA256"

ISCSI_KEEP=1 kp_iscsi_e2e "$PORTAL" "$IQN"
IQN=$ISCSI_E2E_IQN SD=$ISCSI_E2E_DEV
SIZE_MIB=$(( $(cat /sys/block/${SD#/dev/}/size) / 2048 ))
[ "$SIZE_MIB" -ge $((MIB + SEEK)) ] || kp_die "disk too small ($SIZE_MIB MiB) for ${MIB} MiB at ${SEEK} MiB"

kp_step "write ${MIB} MiB at ${SEEK} MiB (O_DIRECT, bs=1M)"
T0=$(kp_uptime)
kp_must dd if=/tmp/pat of="$SD" bs=1M count="$MIB" seek="$SEEK" oflag=direct conv=fsync,notrunc
kp_log "written in $(awk -v a="$T0" -v b="$(kp_uptime)" 'BEGIN{printf "%.1f", b-a}') s (guest time)"
sync
echo 3 > /proc/sys/vm/drop_caches

kp_step "read back (O_DIRECT, bs=1M) and compare"
kp_must dd if="$SD" of=/tmp/rb bs=1M count="$MIB" skip="$SEEK" iflag=direct
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
RB2=$(dd if="$SD" bs=128k count=$((MIB * 8)) skip=$((SEEK * 8)) iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
kp_log "read-back sha256=$RB2"
[ "$RB2" = "$SUM" ] || kp_die "DATA MISMATCH (128 KiB reads)"
rm -f /tmp/pat

kp_step "logout"
kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" --logout
kp_wait 10 sh -c "! ls /sys/block/${SD#/dev/} >/dev/null 2>&1" || kp_die "$SD still present after logout"
kp_log "iscsi-pattern PASSED: ${MIB} MiB written and read back intact ($PORTAL $IQN)"
