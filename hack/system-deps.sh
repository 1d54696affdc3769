#!/usr/bin/env bash
# Install the system packages the tests need when they are missing (Debian).
# Go, Java and Node.js come with the machine; PostgreSQL server binaries,
# openssl, git, mmdebstrap, libseccomp-dev and the OpenSSH server (the git-over-SSH tests start their own sshd on
# loopback) are installed from Debian's packages if absent.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v openssl >/dev/null || missing+=(openssl)
command -v git >/dev/null || missing+=(git)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
# The process node's venv (hack/node-venv.sh) is built from Debian's python3.
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
# The real node (hack/build-node.sh, kubecluster/realnode): CNI plugins, nftables for the
# Service IP redirect, libseccomp for runc's cgo build, a static busybox for the test image.
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v nft >/dev/null || [ -x /usr/sbin/nft ] || missing+=(nftables)
[ -f /usr/include/seccomp.h ] || missing+=(libseccomp-dev)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing+=(busybox-static)
# The images without a registry (hack/build-images.sh): mmdebstrap makes the base images' root
# file systems from Debian packages; runc (hack/build-buildkit.sh) links libseccomp.
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [ ${#missing[@]} -gt 0 ]; then
  echo "system-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Packages must not start their services (openssh-server would listen on every interface):
  # the tests start their own servers on loopback. Docker images ship this policy; add it for
  # the install when the machine has none.
  policy_added=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    policy_added=1
  fi
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
  [ -z "$policy_added" ] || rm -f /usr/sbin/policy-rc.d
fi
for tool in go java javac node; do
  command -v "$tool" >/dev/null || { echo "system-deps: $tool is required and not on PATH" >&2; exit 1; }
done
