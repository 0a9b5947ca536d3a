#!/bin/sh
# The target's connections go away under load and come back, three times,
# over iSCSI: log in (open-iscsi, its default session recovery), start fio
# writing mixed sizes with crc32c verification, then ask the host-side
# runner (marker lines on the console) to drop every connection while the
# daemon keeps running (KP-DROP-NOW: `ironwire ctl disconnect`), to stop the
# target gracefully and serve again (KP-RESTART-NOW), and to kill it with
# SIGKILL and serve again (KP-KILL-NOW), each once the session is back and
# writes flow. Each time the session must leave LOGGED_IN and come back,
# and the SCSI layer must retry what was in flight; fio must end with
# every block it wrote read back verified, and the kernel must have logged
# no I/O error. Then log out.
# Args: PORTAL IQN
# Env:  ISCSI_CHAP_USER / ISCSI_CHAP_PASS (as `iscsi`); FIO_SIZE (MiB
#       written, default 64), FIO_RATE (MiB/s the writes are held to,
#       default 4, so that both events fall in the write pass),
#       FIO_TIMEOUT (s, default 240). Needs the fio layer (KP_WITH_FIO=1).
. /kp/lib.sh
PORTAL=${1:-} IQN=${2:-}
[ -n "$PORTAL" ] && [ -n "$IQN" ] || kp_die "usage: iscsi-restart PORTAL IQN"
command -v fio >/dev/null || kp_die "no fio in the guest (KP_WITH_FIO=1)"
MIB=${FIO_SIZE:-64}

ISCSI_KEEP=1 kp_iscsi_e2e "$PORTAL" "$IQN"
SD=$ISCSI_E2E_DEV
SESSION=
for _s in /sys/class/iscsi_session/session*; do
	[ "$(cat "$_s/targetname")" = "$IQN" ] && SESSION=$_s
done
[ -n "$SESSION" ] || kp_die "no iSCSI session to $IQN in sysfs"
kp_log "session $(basename "$SESSION"), disk $SD, recovery timeout $(cat "$SESSION"/recovery_tmo) s"
dmesg > /tmp/dmesg.before

written() { awk -v d="${SD#/dev/}" '$3 == d { print $10 }' /proc/diskstats; } # sectors written
state() { cat "$SESSION"/state; }
gone() { [ "$(state)" != LOGGED_IN ]; }
back() { [ "$(state)" = LOGGED_IN ]; }
kp_fio_through_events "$SD" iscsi-restart "session"

wait "$FIO"
RC=$?
kp_log "fio rc=$RC after $(awk -v a="$T0" -v b="$(kp_uptime)" 'BEGIN{printf "%.1f", b-a}') s (guest time)"
kp_fio_verified "$RC" "$MIB"

dmesg > /tmp/dmesg.after
tail -n +"$(( $(wc -l < /tmp/dmesg.before) + 1 ))" /tmp/dmesg.after > /tmp/dmesg.new
grep -iE 'iscsi|connection|session|I/O error|sd ' /tmp/dmesg.new | tail -n 30
# Nothing may have reached the block layer as an error (that would be a
# write lost to the host).
if grep -iE 'I/O error|blk_update_request|Buffer I/O error|critical medium error' /tmp/dmesg.new; then
	kp_die "the kernel logged I/O errors (above)"
fi
back || kp_die "session is $(state) at the end"
kp_log "fio clean across a drop, a graceful restart and a SIGKILL: $MIB MiB written and verified over iSCSI"

kp_step "logout"
kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" --logout
kp_log "iscsi-restart PASSED ($PORTAL $IQN)"
