#!/usr/bin/env bash
# Installs and builds, once, what every real-peer runner needs, so that
# scripts/test can then run them side by side with --no-install (two
# runners must not both apt-get, and must not rebuild the guest initramfs
# under each other):
#
#   - QEMU and the host tools kernel-peer uses, gcc/make/patch for siw.ko,
#     fio (for the guest's fio layer), libiscsi-bin (iscsi-test-cu);
#   - kernel-peer's cache (KP_CACHE, default /tmp/kernel-peer-cache): the
#     guest kernel, siw.ko, the initramfs with siw.ko in it and the fio layer.
#
# Run the runners after this with KP_SIW=1 in their environment: they then
# all boot this one initramfs (siw.ko is only loaded by the NVMe/RDMA
# scenarios). Ceph's packages are ceph-peer's to install (its first start).
#
# Usage: tests/interop/prepare.sh
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
KP=$HERE/kernel-peer/kernel-peer
TOOL=prepare
INSTALL=1
# shellcheck source=tests/interop/common.sh
. "$HERE/common.sh"
export KP_CACHE=${KP_CACHE:-/tmp/kernel-peer-cache}
export KP_SIW=1

[[ $# -eq 0 ]] || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }

if ! command -v iscsi-test-cu >/dev/null; then
	apt_install "" libiscsi-bin
fi
ensure_siw
ensure_fio_layer
say "ready: kernel-peer cache $KP_CACHE (with siw.ko and the fio layer), iscsi-test-cu, fio"
