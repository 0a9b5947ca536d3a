#!/bin/sh
# Namespace change at runtime: connect to NQN, then tell the host-side
# runner (marker lines on the console) to add namespace 2 (64 MiB), grow it
# to 96 MiB, and remove it; the target's asynchronous events must make the
# kernel rescan so the block device appears and serves I/O, takes the new
# size and serves I/O at its new end, and disappears again.
# Args: PORT NQN
. /kp/lib.sh
A=${NVME_ADDR:-$KP_HOST} P=${1:-4420} NQN=${2:-}
[ -n "$NQN" ] || kp_die "usage: nvme-aen PORT NQN"

kp_nvme_setup tcp || kp_die "module setup failed"
kp_nvme_connect tcp "$A" "$P" "$NQN"
CTRL=$KP_CTRL
kp_log "namespaces before: $(ls /sys/class/nvme/$CTRL/ | grep -E 'n[0-9]+$' | tr '\n' ' ')"
ns2() { ls /sys/block/ 2>/dev/null | grep -E "^nvme[0-9]+n2$" | head -n 1; }
[ -z "$(ns2)" ] || kp_die "namespace 2 exists before the event"

echo "KP-AEN-ADD-NOW"
kp_wait 60 sh -c '[ -n "$(ls /sys/block/ | grep -E "^nvme[0-9]+n2$")" ]' || kp_die "namespace 2 did not appear (no AEN / rescan)"
N2=/dev/$(ns2)
kp_log "namespace 2 appeared as $N2 ($(cat /sys/block/${N2#/dev/}/size) sectors)"
kp_pattern_check "$N2" 4096 16 8 || kp_die "I/O on the new namespace failed"
dmesg | grep -iE "nvme.*(rescan|changed|ns)" | tail -n 3

echo "KP-AEN-GROW-NOW"
SECTORS=$((96 * 2048))
kp_wait 60 sh -c "[ \$(cat /sys/block/${N2#/dev/}/size) = $SECTORS ]" ||
	kp_die "namespace 2 did not grow to 96 MiB (size $(cat /sys/block/${N2#/dev/}/size) sectors)"
kp_log "namespace 2 grew to $(( $(cat /sys/block/${N2#/dev/}/size) / 2048 )) MiB"
dmesg | grep -iE "capacity change" | tail -n 2
kp_pattern_check "$N2" 4096 16 $(( 96 * 256 - 16 )) || kp_die "I/O at the grown namespace's new end failed"

echo "KP-AEN-REMOVE-NOW"
kp_wait 60 sh -c '[ -z "$(ls /sys/block/ | grep -E "^nvme[0-9]+n2$")" ]' || kp_die "namespace 2 did not go away"
kp_log "namespace 2 removed"
kp_nvme_disconnect "$NQN" "$CTRL"
kp_log "AEN scenario PASSED"
