#!/bin/sh
# The target's connections go away under load and come back, three times:
# connect (reconnect every second, give up after 60 s), start fio writing
# mixed sizes with crc32c verification, then ask the host-side runner
# (marker lines on the console) to drop every connection while the daemon
# keeps running (KP-DROP-NOW: `ironwire ctl disconnect`, as a network blip
# would), to stop the target gracefully and serve again (KP-RESTART-NOW),
# and to kill it with SIGKILL and serve again (KP-KILL-NOW), each once the
# host has reconnected and written more. Each time the kernel host must see
# the controller go, reconnect, and retry what was in flight; fio must end
# with every block it wrote read back verified, and the host must have
# logged no I/O error. Then disconnect.
# Args: PORT NQN
# Env:  NVME_TRANSPORT (tcp|rdma), NVME_ADDR, NVME_EXTRA, KP_HOSTNQN (as
#       nvme-tcp); FIO_SIZE (MiB written, default 64), FIO_RATE (MiB/s the
#       writes are held to, default 4, so that both events fall in the
#       write pass), FIO_TIMEOUT (s, default 240). Needs the fio layer
#       (KP_WITH_FIO=1).
. /kp/lib.sh
TR=${NVME_TRANSPORT:-tcp}
A=${NVME_ADDR:-$KP_HOST} P=${1:-} NQN=${2:-}
[ -n "$P" ] && [ -n "$NQN" ] || kp_die "usage: nvme-restart PORT NQN"
command -v fio >/dev/null || kp_die "no fio in the guest (KP_WITH_FIO=1)"
MIB=${FIO_SIZE:-64}

if [ "$TR" = rdma ]; then kp_siw_up eth0 || kp_die "cannot create siw0 on eth0"; fi
kp_nvme_setup "$TR" || kp_die "module setup failed"
NVME_EXTRA="${NVME_EXTRA:-} --reconnect-delay=1 --ctrl-loss-tmo=60"
kp_nvme_connect "$TR" "$A" "$P" "$NQN"
NS=$KP_NS CTRL=$KP_CTRL
dmesg > /tmp/dmesg.before

# Sectors written to NVMe devices (with native multipath the I/O is counted
# on the hidden path device, nvmeXcYnZ, not on the namespace's node).
written() { awk '$3 ~ /^nvme/ { s += $10 } END { print s + 0 }' /proc/diskstats; }
state() { cat /sys/class/nvme/"$CTRL"/state; }
gone() { [ "$(state)" != live ]; }
back() { [ "$(state)" = live ]; }
kp_fio_through_events "$NS" nvme-restart "controller $CTRL"

wait "$FIO"
RC=$?
kp_log "fio rc=$RC after $(awk -v a="$T0" -v b="$(kp_uptime)" 'BEGIN{printf "%.1f", b-a}') s (guest time)"
kp_fio_verified "$RC" "$MIB"

dmesg > /tmp/dmesg.after
tail -n +"$(( $(wc -l < /tmp/dmesg.before) + 1 ))" /tmp/dmesg.after > /tmp/dmesg.new
grep -iE 'nvme|I/O error' /tmp/dmesg.new | tail -n 30
# Each loss must have ended in a reconnect, and nothing may have reached
# the block layer as an error (that would be a write lost to the host).
N=$(grep -ciE 'Successfully reconnected' /tmp/dmesg.new)
[ "$N" -ge 3 ] || kp_die "the host logged $N successful reconnects (expected 3)"
if grep -iE 'I/O error|blk_update_request|Buffer I/O error|critical medium error' /tmp/dmesg.new; then
	kp_die "the host logged I/O errors (above)"
fi
back || kp_die "controller $CTRL is $(state) at the end"
kp_log "fio clean across a drop, a graceful restart and a SIGKILL: $MIB MiB written and verified over $TR"

kp_nvme_disconnect "$NQN" "$CTRL"
kp_log "nvme-restart PASSED ($TR $A:$P $NQN)"
