#!/bin/sh
# fio with verification through the kernel's NVMe-oF host: connect (over
# NVMe/TCP, or NVMe/RDMA on siw0), then one fio job of O_DIRECT random
# writes of mixed sizes (bssplit) with crc32c verification: every block
# written is read back and checked. It passes only if fio exits 0, reports
# no error, read back exactly what it wrote, and the host logged no I/O
# timeout, controller reset or siw CRC error meanwhile; then disconnect.
# Args: PORT NQN
# Env:  NVME_TRANSPORT (tcp|rdma), NVME_ADDR, NVME_QUEUES, NVME_EXTRA (as
#       nvme-tcp); FIO_SIZE (MiB written, default 64), FIO_OFFSET_MIB (1),
#       FIO_BSSPLIT (4k/40:16k/20:64k/20:128k/20), FIO_IODEPTH (16),
#       FIO_ENGINE (libaio), FIO_TIMEOUT (s, default 100).
#       Needs the fio layer (KP_WITH_FIO=1).
. /kp/lib.sh
TR=${NVME_TRANSPORT:-tcp}
A=${NVME_ADDR:-$KP_HOST} P=${1:-} NQN=${2:-}
[ -n "$P" ] && [ -n "$NQN" ] || kp_die "usage: nvme-fio PORT NQN"
command -v fio >/dev/null || kp_die "no fio in the guest (KP_WITH_FIO=1)"
MIB=${FIO_SIZE:-64} OFF=${FIO_OFFSET_MIB:-1}
BSSPLIT=${FIO_BSSPLIT:-4k/40:16k/20:64k/20:128k/20}
QD=${FIO_IODEPTH:-16} ENGINE=${FIO_ENGINE:-libaio}

if [ "$TR" = rdma ]; then kp_siw_up eth0 || kp_die "cannot create siw0 on eth0"; fi
kp_nvme_setup "$TR" || kp_die "module setup failed"
kp_log "hostnqn=$(cat /etc/nvme/hostnqn) $(fio --version)"
kp_nvme_connect "$TR" "$A" "$P" "$NQN"
NS=$KP_NS CTRL=$KP_CTRL
SIZE_MIB=$(( $(cat /sys/block/"${NS#/dev/}"/size) / 2048 ))
[ "$SIZE_MIB" -ge $((MIB + OFF)) ] || kp_die "namespace too small ($SIZE_MIB MiB) for ${MIB} MiB at ${OFF} MiB"
# From here on, any I/O timeout or reset the host logs is held against the run.
dmesg > /tmp/dmesg.before

kp_step "fio: randwrite bssplit=$BSSPLIT iodepth=$QD $ENGINE, ${MIB} MiB at ${OFF} MiB, crc32c verify"
T0=$(kp_uptime)
set -- fio --name=nvme-fio --filename="$NS" --direct=1 --ioengine="$ENGINE" \
	--iodepth="$QD" --rw=randwrite --bssplit="$BSSPLIT" --size="${MIB}M" --offset="${OFF}M" \
	--verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=1 \
	--output-format=normal,terse --output=/tmp/fio.out
echo "+ $*"
timeout "${FIO_TIMEOUT:-100}" "$@" > /tmp/fio.err 2>&1
RC=$?
kp_log "fio rc=$RC after $(awk -v a="$T0" -v b="$(kp_uptime)" 'BEGIN{printf "%.1f", b-a}') s (guest time)"
kp_fio_verified "$RC" "$MIB"
dmesg > /tmp/dmesg.after
# lines the run added (dmesg is not cut: the ring buffer is far from full)
tail -n +"$(( $(wc -l < /tmp/dmesg.before) + 1 ))" /tmp/dmesg.after > /tmp/dmesg.new
if grep -iE 'nvme.*(timeout|resetting|reconnect|error recovery|I/O error)|blk_update_request|Buffer I/O error|siw: crc error' /tmp/dmesg.new; then
	kp_die "the host logged I/O timeouts or controller resets during fio (above)"
fi
[ "$(cat /sys/class/nvme/"$CTRL"/state)" = live ] || kp_die "controller $CTRL is $(cat /sys/class/nvme/"$CTRL"/state) after fio"
kp_log "fio write + crc32c verify clean: $MIB MiB over $TR"

kp_nvme_disconnect "$NQN" "$CTRL"
kp_log "nvme-fio PASSED ($TR $A:$P $NQN)"
