#!/bin/sh
# Initiator access control: with this boot's initiator name (set it with
# -e KP_ISCSI_INITIATOR=...) SendTargets must not list IQN, and a login to IQN
# (through a static node record) must be REFUSED with an authorization failure
# (login status 0x0202); no session and no disk may appear.  Then, if
# ALLOWED_INITIATOR is set, the same target must accept a login from an iface
# carrying that initiator name (16 KiB O_DIRECT check, logout).
# Args: PORTAL IQN
# Env:  ALLOWED_INITIATOR
. /kp/lib.sh
PORTAL=${1:-${ISCSI_PORTAL:-$KP_HOST:3260}}
IQN=${2:-${ISCSI_IQN:-}}
[ -n "$IQN" ] || kp_die "usage: iscsi-refused PORTAL IQN"

sessions() { ls -d /sys/class/iscsi_session/session* 2>/dev/null; }
sd_disks() { ls -d /sys/block/sd* 2>/dev/null; }

kp_iscsi_setup || kp_die "iscsi setup failed"
ME=$(sed 's/^InitiatorName=//' /etc/iscsi/initiatorname.iscsi)

kp_step "discovery as $ME: $IQN must not be listed"
echo "+ iscsiadm -m discovery -t sendtargets -p $PORTAL"
iscsiadm -m discovery -t sendtargets -p "$PORTAL" > /tmp/kp-disc.txt 2>&1
RC=$?
cat /tmp/kp-disc.txt
# rc 21 (no records) is fine: this initiator may see no target at all
[ "$RC" = 0 ] || [ "$RC" = 21 ] || kp_die "discovery failed rc=$RC"
awk '{print $2}' /tmp/kp-disc.txt | grep -qxF "$IQN" && kp_die "$IQN is listed to $ME, which may not log in to it"
kp_log "$IQN not listed to $ME"

kp_step "login to $IQN as NOT-allowed initiator $ME (must fail: authorization failure)"
kp_must iscsiadm -m node -o new -T "$IQN" -p "$PORTAL" >/dev/null
echo "+ iscsiadm -m node -T $IQN -p $PORTAL --login"
iscsiadm -m node -T "$IQN" -p "$PORTAL" --login > /tmp/refused.out 2>&1
RC=$?
cat /tmp/refused.out
sleep 1
if [ "$RC" = 0 ]; then
	kp_run iscsiadm -m session
	kp_die "login SUCCEEDED for an initiator name the target should refuse"
fi
grep -q 'authorization failure' /tmp/refused.out || kp_die "login failed (rc=$RC) but not with an authorization failure"
kp_log "login refused as expected (rc=$RC, authorization failure)"
[ -z "$(sessions)" ] || kp_die "session(s) exist after the refused login: $(sessions)"
[ -z "$(sd_disks)" ] || kp_die "disk(s) appeared after the refused login: $(sd_disks)"
kp_must iscsiadm -m node -o delete -T "$IQN" -p "$PORTAL"

if [ -n "${ALLOWED_INITIATOR:-}" ]; then
	kp_step "login to $IQN through an iface named $ALLOWED_INITIATOR (must succeed)"
	kp_must iscsiadm -m iface -I kpallowed -o new
	kp_must iscsiadm -m iface -I kpallowed -o update -n iface.initiatorname -v "$ALLOWED_INITIATOR"
	kp_must iscsiadm -m node -o new -T "$IQN" -p "$PORTAL" -I kpallowed
	kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" -I kpallowed --login
	kp_run iscsiadm -m session -P 3 | grep -E 'Target:|Iface Initiatorname|iSCSI Session State'
	kp_wait 20 kp_iscsi_sd_for "$IQN" || kp_die "no SCSI disk appeared for the allowed initiator"
	SD=/dev/$(kp_iscsi_sd_for "$IQN")
	kp_wait 10 test -b "$SD" || kp_die "$SD is not a block device"
	kp_pattern_check "$SD" 4096 4 11 || kp_die "I/O failed for the allowed initiator"
	kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" -I kpallowed --logout
	kp_wait 10 sh -c '! ls -d /sys/class/iscsi_session/session* >/dev/null 2>&1' || kp_die "session left after logout"
	kp_wait 10 sh -c "! ls /sys/block/${SD#/dev/} >/dev/null 2>&1" || kp_die "$SD still present after logout"
else
	kp_log "ALLOWED_INITIATOR not set: skipping the positive check"
fi
kp_log "iscsi-refused PASSED ($PORTAL $IQN)"
