#!/bin/sh
# Guest side of `kernel-peer target-nvmet`: Linux kernel NVMe-oF target (nvmet)
# configured through configfs, listening on guest port 4420 (forwarded from
# host 127.0.0.1:PORT by QEMU hostfwd).  Runs until the VM is killed.
# Env: NVMET_TRANSPORT tcp|rdma, NVMET_NQN, NVMET_SIZE_MB, NVMET_BACKEND file|brd|null_blk,
#      NVMET_HOSTS (space-separated allowed host NQNs; empty = any host),
#      NVMET_LBS (null_blk block size, default 512)
. /kp/lib.sh
T=${NVMET_TRANSPORT:-tcp}
NQN=${NVMET_NQN:-nqn.2024-01.org.kernel-peer:nvmet}
SIZE=${NVMET_SIZE_MB:-128}
BACKEND=${NVMET_BACKEND:-brd}

kp_modprobe nvmet || exit 1
case $T in
tcp)  kp_modprobe nvmet-tcp || exit 1; TRADDR=0.0.0.0 ;;
rdma) kp_siw_up eth0 || exit 1; kp_modprobe nvmet-rdma || exit 1; TRADDR=$KP_GUEST_IP ;;
*)    kp_die "unknown transport $T" ;;
esac

BUFFERED=0
case $BACKEND in
file)	# sparse file on tmpfs (guest RAM); tmpfs has no O_DIRECT in 6.1 -> buffered_io
	DEV=/tmp/nvmet-ns1.img; truncate -s "${SIZE}M" "$DEV" || exit 1; BUFFERED=1 ;;
brd)	kp_modprobe brd || exit 1; rmmod brd; modprobe brd rd_nr=1 rd_size=$((SIZE * 1024)) max_part=0 || exit 1
	DEV=/dev/ram0 ;;
null_blk)
	modprobe null_blk nr_devices=0 || exit 1
	N=/sys/kernel/config/nullb/nullb0; mkdir $N
	echo "$SIZE" > $N/size; echo 1 > $N/memory_backed; echo 1 > $N/discard
	echo "${NVMET_LBS:-512}" > $N/blocksize; echo 1 > $N/power
	DEV=/dev/nullb0 ;;
*) kp_die "unknown backend $BACKEND" ;;
esac
kp_wait 5 test -e "$DEV" || kp_die "$DEV missing"

C=/sys/kernel/config/nvmet
S=$C/subsystems/$NQN
mkdir "$S" || exit 1
if [ -n "${NVMET_HOSTS:-}" ]; then
	# only these host NQNs may connect (ironwire: nvme-refused self-test)
	echo 0 > "$S/attr_allow_any_host"
	for H in $NVMET_HOSTS; do
		mkdir -p "$C/hosts/$H" && ln -s "$C/hosts/$H" "$S/allowed_hosts/$H" || kp_die "cannot allow host $H"
	done
	kp_log "allowed hosts: $NVMET_HOSTS"
else
	echo 1 > "$S/attr_allow_any_host"
fi
echo kernelpeer0001 > "$S/attr_serial" 2>/dev/null
mkdir "$S/namespaces/1"
printf '%s' "$DEV" > "$S/namespaces/1/device_path"
[ "$BUFFERED" = 1 ] && echo 1 > "$S/namespaces/1/buffered_io"
echo 1 > "$S/namespaces/1/enable" || kp_die "cannot enable namespace on $DEV"
P=$C/ports/1
mkdir "$P"
echo ipv4 > "$P/addr_adrfam"
echo "$T" > "$P/addr_trtype"
echo "$TRADDR" > "$P/addr_traddr"
echo 4420 > "$P/addr_trsvcid"
ln -s "$S" "$P/subsystems/$NQN" || kp_die "cannot enable port"
kp_log "nvmet $T listening on $TRADDR:4420 (host 127.0.0.1:${NVMET_HOST_PORT:-?}), subsystem $NQN, ns1=$DEV ${SIZE}MiB"
echo "KP-TARGET-READY transport=$T port=${NVMET_HOST_PORT:-} nqn=$NQN size_mb=$SIZE backend=$BACKEND hosts=${NVMET_HOSTS:-any}"
# show kernel info messages (controller creation, errors) on the console from now on
dmesg -n 7
kp_dyndbg
while :; do sleep 3600; done
