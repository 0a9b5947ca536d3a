#!/bin/sh
# A logical unit grows under a logged-in session: log in (open-iscsi), then
# ask the host-side runner (KP-GROW-NOW on the console) to grow the LU's
# device with `ironwire ctl set device size=`. A command after that must
# meet the unit attention CAPACITY DATA HAS CHANGED (the kernel logs
# "Capacity data has changed"); a rescan, what a udev rule may do on that
# event (there is no udev here), must give the disk the new size, and data
# written at the new end must read back. Then log out.
# Args: PORTAL IQN
# Env:  GROW_MIB (the size the runner grows the LU to, MiB; required),
#       ISCSI_CHAP_USER / ISCSI_CHAP_PASS (as `iscsi`)
. /kp/lib.sh
PORTAL=${1:-} IQN=${2:-} MIB=${GROW_MIB:-}
[ -n "$PORTAL" ] && [ -n "$IQN" ] && [ -n "$MIB" ] || kp_die "usage: GROW_MIB=N iscsi-grow PORTAL IQN"

ISCSI_KEEP=1 kp_iscsi_e2e "$PORTAL" "$IQN"
SD=$ISCSI_E2E_DEV DISK=${ISCSI_E2E_DEV#/dev/}
BEFORE=$(cat /sys/block/"$DISK"/size)
[ "$BEFORE" -lt $((MIB * 2048)) ] || kp_die "$SD has $((BEFORE / 2048)) MiB already, not less than $MIB"
dmesg > /tmp/dmesg.before

kp_step "grow the LU to $MIB MiB (the runner's ctl)"
echo "KP-GROW-NOW"
# Each read is a command that can carry the unit attention; the SCSI
# layer logs it and retries the read.
told() {
	dd if="$SD" of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null
	dmesg | tail -n +"$(( $(wc -l < /tmp/dmesg.before) + 1 ))" | grep -qi 'capacity data has changed'
}
kp_wait 60 told || { dmesg | tail -n 20; kp_die "no CAPACITY DATA HAS CHANGED unit attention reached the kernel"; }
kp_log "the kernel logged: $(dmesg | grep -i 'capacity data has changed' | tail -n 1)"
[ "$(cat /sys/block/"$DISK"/size)" = "$BEFORE" ] || kp_log "(the disk took the new size without a rescan)"

kp_step "rescan $SD"
echo 1 > /sys/block/"$DISK"/device/rescan
kp_wait 20 sh -c "[ \$(cat /sys/block/$DISK/size) = $((MIB * 2048)) ]" ||
	kp_die "$SD did not grow to $MIB MiB (size $(cat /sys/block/"$DISK"/size) sectors)"
kp_log "$SD grew from $((BEFORE / 2048)) to $MIB MiB"
dmesg | grep -iE 'capacity change|logical blocks' | tail -n 2
LBS=$(kp_lbs "$SD")
kp_pattern_check "$SD" "$LBS" 16 $((MIB * 1048576 / LBS - 16)) || kp_die "I/O at the grown LU's new end failed"

kp_step "logout"
kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" --logout
kp_log "iscsi-grow PASSED ($PORTAL $IQN)"
