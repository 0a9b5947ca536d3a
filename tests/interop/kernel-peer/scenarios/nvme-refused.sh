#!/bin/sh
# Host access control: with the host NQN of this boot (set it with
# -e KP_HOSTNQN=...) the target must REFUSE the connection to NQN, and no
# controller or namespace may appear. Then, if ALLOWED_HOSTNQN is set, the
# same subsystem must accept that host NQN (connect, see the namespace,
# disconnect).
# Args: PORT NQN
# Env:  NVME_TRANSPORT (tcp|rdma), NVME_ADDR, ALLOWED_HOSTNQN, ALLOWED_HOSTID (default: a fresh UUID)
. /kp/lib.sh
TR=${NVME_TRANSPORT:-tcp}  # tcp, or rdma: NVMe/RDMA over soft-iWARP (siw0 on eth0)
A=${NVME_ADDR:-$KP_HOST} P=${1:-${NVME_PORT:-4420}} NQN=${2:-${NVME_NQN:-}}
[ -n "$NQN" ] || kp_die "usage: nvme-refused PORT NQN"
HOSTNQN=$(cat /etc/nvme/hostnqn)

nvme_devs() { ls /dev/nvme* 2>/dev/null | grep -E '^/dev/nvme[0-9]+(n[0-9]+)?$' | grep -v '^/dev/nvme-fabrics$'; }
ns_devs() { ls /dev/nvme* 2>/dev/null | grep -E '^/dev/nvme[0-9]+n[0-9]+$'; }

if [ "$TR" = rdma ]; then kp_siw_up eth0 || kp_die "cannot create siw0 on eth0"; fi
kp_nvme_setup "$TR" || kp_die "module setup failed"
[ -z "$(ns_devs)" ] || kp_die "namespaces present before the test: $(ns_devs)"

kp_step "connect to $NQN as NOT-allowed host $HOSTNQN (must fail)"
# shellcheck disable=SC2046
echo "+ nvme connect $(kp_nvme_connect_args "$TR" "$A" "$P" "$NQN") --hostnqn $HOSTNQN"
# shellcheck disable=SC2046
nvme connect $(kp_nvme_connect_args "$TR" "$A" "$P" "$NQN") --hostnqn "$HOSTNQN" > /tmp/refused.out 2>&1
RC=$?
cat /tmp/refused.out
dmesg | grep -i nvme | tail -n 5
sleep 1
if [ "$RC" = 0 ]; then
	kp_run nvme list
	kp_die "nvme connect SUCCEEDED for a host NQN the target should refuse"
fi
kp_log "nvme connect failed as expected (rc=$RC)"
kp_nvme_ctrl_for "$NQN" >/dev/null && kp_die "a controller for $NQN exists after the refused connect: $(kp_nvme_ctrl_for "$NQN")"
[ -z "$(ns_devs)" ] || kp_die "namespace device(s) appeared after the refused connect: $(ns_devs)"
kp_log "no controller for $NQN, no namespace device (devices: $(nvme_devs | tr '\n' ' '))"

if [ -n "${ALLOWED_HOSTNQN:-}" ]; then
	HOSTID=${ALLOWED_HOSTID:-$(cat /proc/sys/kernel/random/uuid)}
	kp_step "connect to $NQN as allowed host $ALLOWED_HOSTNQN (must succeed)"
	NVME_EXTRA="${NVME_EXTRA:+$NVME_EXTRA }--hostnqn $ALLOWED_HOSTNQN --hostid $HOSTID"
	kp_nvme_connect "$TR" "$A" "$P" "$NQN"
	kp_must nvme id-ns "$KP_NS" > /dev/null
	kp_pattern_check "$KP_NS" 4096 4 11 || kp_die "I/O failed for the allowed host"
	kp_nvme_disconnect "$NQN" "$KP_CTRL"
else
	kp_log "ALLOWED_HOSTNQN not set: skipping the positive check"
fi
kp_log "nvme-refused PASSED ($A:$P $NQN)"
