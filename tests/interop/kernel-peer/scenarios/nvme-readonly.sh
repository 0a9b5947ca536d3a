#!/bin/sh
# A read-only namespace: the kernel must mark the disk read-only (the
# target sets NSATTR bit 0), read what the target's file holds, refuse a
# write through the block layer, and get an error for a write sent past it
# (nvme write, a passthrough command the target must refuse itself).
# Args: PORT NQN
# Env:  NVME_TRANSPORT (tcp|rdma), NVME_ADDR, GOLDEN_MIB, GOLDEN_SHA256
#       (the namespace's first GOLDEN_MIB MiB)
. /kp/lib.sh
TR=${NVME_TRANSPORT:-tcp}
A=${NVME_ADDR:-$KP_HOST} P=${1:-${NVME_PORT:-4420}} NQN=${2:-${NVME_NQN:-}}
[ -n "$NQN" ] && [ -n "${GOLDEN_SHA256:-}" ] || kp_die "usage: GOLDEN_MIB=N GOLDEN_SHA256=X nvme-readonly PORT NQN"
kp_nvme_setup "$TR" || kp_die "module setup failed"
kp_nvme_connect "$TR" "$A" "$P" "$NQN"
NS=$KP_NS

kp_step "the namespace is read-only"
kp_must nvme id-ns "$NS" > /tmp/kp-idns.txt
grep -E '^nsattr' /tmp/kp-idns.txt
kp_golden_read_only "$NS"

kp_step "a write past the block layer is refused by the target"
head -c 512 /dev/zero > /tmp/kp-zero512
echo "+ nvme write $NS -s 0 -c 0 -z 512 -d /tmp/kp-zero512"
if nvme write "$NS" -s 0 -c 0 -z 512 -d /tmp/kp-zero512 > /tmp/kp-nvmew.txt 2>&1; then
	cat /tmp/kp-nvmew.txt
	kp_die "a passthrough write to $NS succeeded"
fi
cat /tmp/kp-nvmew.txt
# The target's own answer, not a refusal on the host's side (an open or
# permission error would fail the command just the same).
grep -qi 'write protected' /tmp/kp-nvmew.txt ||
	kp_die "nvme write failed, but not with Namespace is Write Protected"
SUM=$(dd if="$NS" bs=1M count="${GOLDEN_MIB:-16}" iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
[ "$SUM" = "$GOLDEN_SHA256" ] || kp_die "the image changed: $SUM"
kp_nvme_disconnect "$NQN" "$KP_CTRL"
kp_log "nvme-readonly PASSED ($A:$P $NQN)"
