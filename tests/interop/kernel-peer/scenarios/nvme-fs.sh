#!/bin/sh
# ext4 on the namespace: connect, mkfs.ext4, mount, write FS_FILES files of
# random sizes (up to FS_MAX_KIB KiB each), sync, record sha256sums, umount,
# e2fsck -fn, mount again, verify the sums, umount, disconnect.
# Args: [PORT] [NQN]  (NQN default: first NVM subsystem in the discovery log)
# Env:  NVME_TRANSPORT (tcp|rdma), NVME_ADDR, NVME_DIGEST=1, NVME_QUEUES=N, NVME_EXTRA, FS_FILES (20),
#       FS_MAX_KIB (4096)
. /kp/lib.sh
TR=${NVME_TRANSPORT:-tcp}  # tcp, or rdma: NVMe/RDMA over soft-iWARP (siw0 on eth0)
A=${NVME_ADDR:-$KP_HOST} P=${1:-${NVME_PORT:-4420}} NQN=${2:-${NVME_NQN:-}}
NFILES=${FS_FILES:-20} MAXKIB=${FS_MAX_KIB:-4096}
MNT=/mnt/nvme

rand() { # rand N : pseudo-random integer in [0, N)
	echo $(( $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % $1 ))
}

if [ "$TR" = rdma ]; then kp_siw_up eth0 || kp_die "cannot create siw0 on eth0"; fi
kp_nvme_setup "$TR" || kp_die "module setup failed"
kp_modprobe ext4 || kp_die "no ext4 module"
kp_log "hostnqn=$(cat /etc/nvme/hostnqn)"
if [ -z "$NQN" ]; then
	kp_nvme_discover "$TR" "$A" "$P" || kp_die "nvme discover failed"
	NQN=$KP_DISC_NQN
	[ -n "$NQN" ] || kp_die "no NVM subsystem in discovery log"
fi
kp_nvme_connect "$TR" "$A" "$P" "$NQN"
NS=$KP_NS CTRL=$KP_CTRL

kp_step "mkfs.ext4 $NS"
kp_must /sbin/mkfs.ext4 -F -q -L ironwire "$NS"
kp_run /sbin/e2fsck -fn "$NS" >/dev/null || kp_die "fresh filesystem does not check clean"

kp_step "mount and write $NFILES files (up to $MAXKIB KiB each)"
mkdir -p "$MNT"
kp_must mount -t ext4 "$NS" "$MNT"
mkdir -p "$MNT/d1/d2"
TOTAL=0
i=1
while [ "$i" -le "$NFILES" ]; do
	SZ=$(( $(rand $((MAXKIB * 1024))) + 1 ))
	case $((i % 3)) in 0) F=$MNT/f$i ;; 1) F=$MNT/d1/f$i ;; *) F=$MNT/d1/d2/f$i ;; esac
	head -c "$SZ" /dev/urandom > "$F" || kp_die "writing $F failed"
	TOTAL=$((TOTAL + SZ))
	i=$((i + 1))
done
kp_log "wrote $NFILES files, $TOTAL bytes"
kp_must sync
(cd "$MNT" && find . -type f | sort | xargs sha256sum) > /tmp/sums || kp_die "sha256sum failed"
[ "$(wc -l < /tmp/sums)" = "$NFILES" ] || kp_die "expected $NFILES files, found $(wc -l < /tmp/sums)"
head -n 3 /tmp/sums; echo "..."
kp_run df -k "$MNT"

kp_step "umount, fsck, drop caches, mount again"
kp_must umount "$MNT"
echo 3 > /proc/sys/vm/drop_caches
kp_run /sbin/e2fsck -fn "$NS" || kp_die "e2fsck found errors after umount"
kp_must mount -t ext4 "$NS" "$MNT"

kp_step "verify sha256sums"
(cd "$MNT" && sha256sum -c /tmp/sums) > /tmp/check 2>&1 || { cat /tmp/check; kp_die "checksum mismatch after remount"; }
kp_log "all $NFILES files verified"
kp_must umount "$MNT"

kp_nvme_disconnect "$NQN" "$CTRL"
kp_log "nvme-fs PASSED: ext4, $NFILES files, $TOTAL bytes intact across remount ($A:$P $NQN)"
