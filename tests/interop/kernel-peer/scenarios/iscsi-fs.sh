#!/bin/sh
# ext4 over iSCSI: login (plus the short data battery), mkfs.ext4, mount, write
# FS_FILES files of random sizes (up to FS_MAX_KIB KiB each), sync, record
# sha256sums, umount, e2fsck -fn, mount again, verify the sums, umount, logout.
# Args: PORTAL IQN
# Env:  FS_FILES (20), FS_MAX_KIB (4096), plus ISCSI_DIGEST / ISCSI_CHAP_* of `iscsi`
. /kp/lib.sh
PORTAL=${1:-${ISCSI_PORTAL:-$KP_HOST:3260}}
IQN=${2:-${ISCSI_IQN:-}}
NFILES=${FS_FILES:-20} MAXKIB=${FS_MAX_KIB:-4096}
MNT=/mnt/iscsi

rand() { # rand N : pseudo-random integer in [0, N)
	echo $(( $(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % $1 ))
}

kp_modprobe ext4 || kp_die "no ext4 module"
ISCSI_KEEP=1 kp_iscsi_e2e "$PORTAL" "$IQN"
IQN=$ISCSI_E2E_IQN SD=$ISCSI_E2E_DEV

kp_step "mkfs.ext4 $SD"
kp_must /sbin/mkfs.ext4 -F -q -L ironwire "$SD"
kp_run /sbin/e2fsck -fn "$SD" >/dev/null || kp_die "fresh filesystem does not check clean"

kp_step "mount and write $NFILES files (up to $MAXKIB KiB each)"
mkdir -p "$MNT"
kp_must mount -t ext4 "$SD" "$MNT"
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
kp_run /sbin/e2fsck -fn "$SD" || kp_die "e2fsck found errors after umount"
kp_must mount -t ext4 "$SD" "$MNT"

kp_step "verify sha256sums"
(cd "$MNT" && sha256sum -c /tmp/sums) > /tmp/check 2>&1 || { cat /tmp/check; kp_die "checksum mismatch after remount"; }
kp_log "all $NFILES files verified"
kp_must umount "$MNT"

kp_step "logout"
kp_must iscsiadm -m node -T "$IQN" -p "$PORTAL" --logout
kp_wait 10 sh -c "! ls /sys/block/${SD#/dev/} >/dev/null 2>&1" || kp_die "$SD still present after logout"
kp_log "iscsi-fs PASSED: ext4, $NFILES files, $TOTAL bytes intact across remount ($PORTAL $IQN)"
