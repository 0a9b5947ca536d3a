#!/bin/sh
# Two gateways, one namespace, the kernel's native NVMe multipath: connect
# to NQN through gateway A (PORT_A) and gateway B (PORT_B), check that the
# host sees one subsystem with two live paths and one namespace block
# device, then run fio with crc32c verification on it. While fio writes,
# the console says KP-MP-KILL-NOW and the host-side runner kills gateway A
# with SIGKILL; the host must fail its I/O over to B, and fio's verify
# pass, which reads back every block written before and after the kill
# through the survivor, must be clean.
# Args: PORT_A PORT_B NQN
# Env:  MP_FIO_SIZE (bytes fio writes, default 64M: about 14 s of writes
#       under TCG, far past the kill), MP_KILL_AFTER (s of
#       fio before the marker, default 2). Needs the fio layer (KP_WITH_FIO=1).
. /kp/lib.sh
A=${NVME_ADDR:-$KP_HOST} PA=${1:-} PB=${2:-} NQN=${3:-}
[ -n "$PA" ] && [ -n "$PB" ] && [ -n "$NQN" ] || kp_die "usage: nvme-multipath PORT_A PORT_B NQN"
command -v fio >/dev/null || kp_die "no fio in the guest (KP_WITH_FIO=1)"

kp_nvme_setup tcp || kp_die "module setup failed"
[ "$(cat /sys/module/nvme_core/parameters/multipath)" = Y ] || kp_die "native NVMe multipath is off"

kp_step "connect to both gateways"
# A short reconnect delay keeps the dead path's retries visible in the log.
kp_must nvme connect -t tcp -a "$A" -s "$PA" -n "$NQN" --reconnect-delay 2
kp_must nvme connect -t tcp -a "$A" -s "$PB" -n "$NQN" --reconnect-delay 2
ctrls() { for c in /sys/class/nvme/nvme*; do [ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$NQN" ] && basename "$c"; done; }
kp_wait 20 sh -c "[ \$(for c in /sys/class/nvme/nvme*; do cat \$c/subsysnqn; done 2>/dev/null | grep -cxF '$NQN') = 2 ]" ||
	kp_die "two controllers for $NQN did not appear"
CTRLS=$(ctrls | tr '\n' ' ')
kp_log "controllers: $CTRLS"
for c in $CTRLS; do
	kp_log "$c: address=$(tr '\n' ' ' < /sys/class/nvme/$c/address) cntlid=$(cat /sys/class/nvme/$c/cntlid) state=$(cat /sys/class/nvme/$c/state)"
done
SUBSYS=$(for s in /sys/class/nvme-subsystem/*; do [ "$(cat "$s/subsysnqn")" = "$NQN" ] && echo "$s"; done)
[ "$(echo "$SUBSYS" | grep -c .)" = 1 ] || kp_die "$NQN is split over several host subsystems: $SUBSYS"
for c in $CTRLS; do
	[ -e "$SUBSYS/$c" ] || kp_die "controller $c is not in $SUBSYS"
done
kp_wait 20 sh -c 'ls /dev/ | grep -qE "^nvme[0-9]+n1$"' || kp_die "no namespace block device"
HEADS=$(ls /dev/ | grep -cE '^nvme[0-9]+n[0-9]+$')
[ "$HEADS" = 1 ] || { ls -l /dev/nvme*; kp_die "expected one namespace block device, found $HEADS"; }
NS=/dev/$(ls /dev/ | grep -E '^nvme[0-9]+n[0-9]+$')
kp_run nvme list-subsys "$NS"
# Each controller's path to the namespace is a hidden nvmeXcYnZ disk.
PATHS=0
for c in $CTRLS; do
	for p in /sys/class/nvme/"$c"/nvme*c*n1; do
		[ -e "$p" ] || continue
		PATHS=$((PATHS + 1))
		kp_log "path $(basename "$p"): ana_state=$(cat "$p/ana_state" 2>/dev/null)"
	done
done
[ "$PATHS" = 2 ] || kp_die "expected 2 paths to $NS, found $PATHS"
kp_log "one namespace $NS with two paths"

kp_step "fio verify while gateway A is killed"
SIZE=${MP_FIO_SIZE:-64M}
fio --name=mp --filename="$NS" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite --bs=4k \
	--size="$SIZE" --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=1 \
	--output=/tmp/fio.out > /tmp/fio.err 2>&1 &
FIO=$!
sleep "${MP_KILL_AFTER:-2}"
kill -0 "$FIO" 2>/dev/null || { cat /tmp/fio.out /tmp/fio.err; kp_die "fio ended before the kill (raise MP_FIO_SIZE)"; }
echo "KP-MP-KILL-NOW"
# The killed gateway's path leaves "live"; fio must still be running then,
# so the failover happened under its I/O.
dead() { for c in $CTRLS; do [ "$(cat /sys/class/nvme/$c/state)" != live ] && { echo "$c"; return 0; }; done; return 1; }
kp_wait 60 dead || kp_die "no path left the live state after the kill"
DEAD=$(dead)
kill -0 "$FIO" 2>/dev/null || { cat /tmp/fio.out; kp_die "fio had finished before the path went down: the kill did not hit its I/O (raise MP_FIO_SIZE)"; }
kp_log "path $DEAD is $(cat /sys/class/nvme/$DEAD/state) while fio runs"
wait "$FIO"
RC=$?
cat /tmp/fio.out
[ -s /tmp/fio.err ] && cat /tmp/fio.err
[ "$RC" = 0 ] || kp_die "fio failed (rc=$RC)"
grep -q 'err= 0' /tmp/fio.out || kp_die "fio reported errors"
grep -qE 'verify|read:' /tmp/fio.out || kp_die "no verify pass in fio's output"
dmesg | grep -iE 'nvme|failover|requeue' | tail -n 12
kp_log "fio write + verify clean across the kill of $DEAD"

kp_step "disconnect"
kp_must nvme disconnect -n "$NQN"
kp_log "multipath scenario PASSED"
