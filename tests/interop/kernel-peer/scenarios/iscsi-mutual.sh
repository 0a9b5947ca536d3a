#!/bin/sh
# Mutual CHAP: (1) the initiator is configured with a WRONG target secret
# (node.session.auth.password_in): the target's CHAP response must not verify
# and the login must fail, with no session left; (2) with the right target
# secret, the full iscsi battery (login, data, logout).
# Args: PORTAL IQN
# Env (required): ISCSI_CHAP_USER ISCSI_CHAP_PASS ISCSI_MUTUAL_USER ISCSI_MUTUAL_PASS
. /kp/lib.sh
PORTAL=${1:-${ISCSI_PORTAL:-$KP_HOST:3260}}
IQN=${2:-${ISCSI_IQN:-}}
[ -n "$IQN" ] || kp_die "usage: iscsi-mutual PORTAL IQN"
[ -n "${ISCSI_CHAP_USER:-}" ] && [ -n "${ISCSI_CHAP_PASS:-}" ] || kp_die "set ISCSI_CHAP_USER and ISCSI_CHAP_PASS"
[ -n "${ISCSI_MUTUAL_USER:-}" ] && [ -n "${ISCSI_MUTUAL_PASS:-}" ] || kp_die "set ISCSI_MUTUAL_USER and ISCSI_MUTUAL_PASS"

kp_iscsi_setup || kp_die "iscsi setup failed"
kp_step "discovery $PORTAL"
kp_iscsi_discover "$PORTAL" "$IQN" || kp_die "discovery failed"

kp_step "negative: mutual CHAP with a wrong target secret must fail"
kp_iscsi_node_set "$IQN" "$PORTAL" node.session.auth.authmethod CHAP
kp_iscsi_node_set "$IQN" "$PORTAL" node.session.auth.username "$ISCSI_CHAP_USER"
kp_iscsi_node_set "$IQN" "$PORTAL" node.session.auth.password "$ISCSI_CHAP_PASS"
kp_iscsi_node_set "$IQN" "$PORTAL" node.session.auth.username_in "$ISCSI_MUTUAL_USER"
kp_iscsi_node_set "$IQN" "$PORTAL" node.session.auth.password_in "wrong-$ISCSI_MUTUAL_PASS"
if kp_run iscsiadm -m node -T "$IQN" -p "$PORTAL" --login; then
	kp_die "login succeeded although the target could not prove the (wrong) target secret"
fi
sleep 1
ls -d /sys/class/iscsi_session/session* >/dev/null 2>&1 && kp_die "a session exists after the failed mutual login"
kp_log "wrong target secret: login failed as expected"

kp_step "negative: a wrong target user name must fail too"
kp_iscsi_node_set "$IQN" "$PORTAL" node.session.auth.username_in "not-$ISCSI_MUTUAL_USER"
kp_iscsi_node_set "$IQN" "$PORTAL" node.session.auth.password_in "$ISCSI_MUTUAL_PASS"
if kp_run iscsiadm -m node -T "$IQN" -p "$PORTAL" --login; then
	kp_die "login succeeded although the target named itself differently from username_in"
fi
sleep 1
ls -d /sys/class/iscsi_session/session* >/dev/null 2>&1 && kp_die "a session exists after the failed mutual login"
kp_log "wrong target user name: login failed as expected"

kp_step "positive: right target secret"
kp_iscsi_e2e "$PORTAL" "$IQN"
