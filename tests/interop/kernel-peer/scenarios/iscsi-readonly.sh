#!/bin/sh
# A read-only LUN: the target reports WP in MODE SENSE, so Linux's sd must
# say "Write Protect is on" and mark the disk read-only; the disk reads back
# what the target's file holds, and a write through the block layer fails.
# Args: PORTAL IQN
# Env:  GOLDEN_MIB, GOLDEN_SHA256 (the LUN's first GOLDEN_MIB MiB)
. /kp/lib.sh
PORTAL=${1:-${ISCSI_PORTAL:-$KP_HOST:3260}}
IQN=${2:-${ISCSI_IQN:-}}
[ -n "$IQN" ] && [ -n "${GOLDEN_SHA256:-}" ] || kp_die "usage: GOLDEN_MIB=N GOLDEN_SHA256=X iscsi-readonly PORTAL IQN"
kp_iscsi_setup || kp_die "iscsi setup failed"
kp_step "discovery (SendTargets) $PORTAL"
kp_iscsi_discover "$PORTAL" "$IQN" || kp_die "discovery failed"
kp_step "login $IQN"
kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" --login
kp_wait 20 kp_iscsi_sd_for "$IQN" || { kp_run iscsiadm -m session -P 3; kp_die "no SCSI disk appeared"; }
SD=/dev/$(kp_iscsi_sd_for "$IQN")
kp_wait 10 test -b "$SD" || kp_die "$SD is not a block device"

kp_step "the disk is read-only"
dmesg | grep -i "${SD#/dev/}.*write protect" || true
dmesg | grep -qi "${SD#/dev/}.*Write Protect is on" || kp_die "sd did not see WP for $SD"
kp_golden_read_only "$SD"

kp_step "logout"
kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" --logout
kp_wait 10 sh -c "! ls /sys/block/${SD#/dev/} >/dev/null 2>&1" || kp_die "$SD still present after logout"
kp_log "iscsi-readonly PASSED ($PORTAL $IQN)"
