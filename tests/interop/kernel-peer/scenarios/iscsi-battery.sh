#!/bin/sh
# iSCSI battery with discovery and logout checks: SendTargets must list every
# target in ISCSI_EXPECT_TARGETS and none in ISCSI_ABSENT_TARGETS (targets this
# initiator may not see); login (CHAP / digests as in the `iscsi` scenario);
# the data battery; with ISCSI_DIGEST=1 the session must report CRC32C header
# and data digests; logout, after which no iSCSI session and no SCSI disk may
# remain.
# Args: PORTAL IQN
# Env:  ISCSI_EXPECT_TARGETS, ISCSI_ABSENT_TARGETS (space-separated IQNs),
#       ISCSI_EXPECT_LBS (logical block size the disk must have),
#       ISCSI_DIGEST=1, ISCSI_CHAP_USER/PASS, ISCSI_MUTUAL_USER/PASS,
#       KP_ISCSI_INITIATOR (this boot's initiator name)
. /kp/lib.sh
PORTAL=${1:-${ISCSI_PORTAL:-$KP_HOST:3260}}
IQN=${2:-${ISCSI_IQN:-}}
[ -n "$IQN" ] || kp_die "usage: iscsi-battery PORTAL IQN"

sessions() { ls -d /sys/class/iscsi_session/session* 2>/dev/null; }
sd_disks() { ls -d /sys/block/sd* 2>/dev/null; }

kp_iscsi_setup || kp_die "iscsi setup failed"
[ -z "$(sessions)" ] || kp_die "iSCSI sessions present before the test: $(sessions)"
[ -z "$(sd_disks)" ] || kp_die "SCSI disks present before the test: $(sd_disks)"

kp_step "discovery (SendTargets) $PORTAL as $(sed 's/^InitiatorName=//' /etc/iscsi/initiatorname.iscsi)"
kp_iscsi_discover "$PORTAL" "$IQN" || kp_die "discovery failed"
for t in ${ISCSI_EXPECT_TARGETS:-}; do
	awk '{print $2}' /tmp/kp-disc.txt | grep -qxF "$t" || kp_die "$t is missing from the SendTargets response"
	kp_log "listed: $t"
done
for t in ${ISCSI_ABSENT_TARGETS:-}; do
	awk '{print $2}' /tmp/kp-disc.txt | grep -qxF "$t" && kp_die "$t is listed by SendTargets but this initiator may not log in to it"
	kp_log "not listed (as expected): $t"
done

ISCSI_KEEP=1 kp_iscsi_e2e "$PORTAL" "$IQN"
SD=$ISCSI_E2E_DEV
if [ -n "${ISCSI_EXPECT_LBS:-}" ]; then
	[ "$(kp_lbs "$SD")" = "$ISCSI_EXPECT_LBS" ] || kp_die "$SD has logical block size $(kp_lbs "$SD"), expected $ISCSI_EXPECT_LBS"
	kp_log "$SD logical block size $ISCSI_EXPECT_LBS as configured"
fi
if [ "${ISCSI_DIGEST:-0}" = 1 ]; then
	kp_step "negotiated digests"
	iscsiadm -m session -P 2 > /tmp/kp-sess.txt 2>&1
	grep -E 'HeaderDigest|DataDigest' /tmp/kp-sess.txt
	grep -q 'HeaderDigest: CRC32C' /tmp/kp-sess.txt || kp_die "HeaderDigest is not CRC32C"
	grep -q 'DataDigest: CRC32C' /tmp/kp-sess.txt || kp_die "DataDigest is not CRC32C"
fi

kp_step "logout"
kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" --logout
kp_wait 10 sh -c "! ls /sys/block/${SD#/dev/} >/dev/null 2>&1" || kp_die "$SD still present after logout"
kp_wait 10 sh -c '! ls -d /sys/class/iscsi_session/session* >/dev/null 2>&1' || kp_die "iSCSI session(s) left after logout: $(sessions)"
[ -z "$(sd_disks)" ] || kp_die "SCSI disk(s) left after logout: $(sd_disks)"
kp_run iscsiadm -m session && kp_die "iscsiadm still lists a session after logout"
kp_log "no session, no disk left"
kp_log "iscsi-battery PASSED ($PORTAL $IQN)"
