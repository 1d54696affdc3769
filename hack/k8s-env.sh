#!/usr/bin/env bash
# Single source of truth for the test control plane's versions and binary cache
# path. hack/build-k8s.sh sources it; the pytest fixture runs it with --vars, so
# the build and the tests always agree on where the binaries live.
#
#   hack/k8s-env.sh          print the bin dir
#   hack/k8s-env.sh --vars   print KEY=VALUE lines (versions and bin dir)
#
# K8S_TEST_BINS overrides the bin dir; THOP_CACHE moves the whole cache.
K8S_VERSION=${K8S_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.7.3}
HELM_VERSION=${HELM_VERSION:-3.22.0}
THOP_CACHE=${THOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/taskhandler-operator}
K8S_TEST_BINS=${K8S_TEST_BINS:-$THOP_CACHE/k8s/v$K8S_VERSION-etcd$ETCD_VERSION-helm$HELM_VERSION}
# The real node (hack/build-node.sh): kubelet and kube-scheduler share K8S_VERSION.
CONTAINERD_VERSION=${CONTAINERD_VERSION:-2.4.2}
RUNC_VERSION=${RUNC_VERSION:-1.5.3}
NODE_BINS=${NODE_BINS:-$THOP_CACHE/node/v$K8S_VERSION-containerd$CONTAINERD_VERSION-runc$RUNC_VERSION}

# Printing only when executed, not when sourced.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  if [ "${1:-}" = "--vars" ]; then
    printf 'K8S_VERSION=%s\nETCD_VERSION=%s\nHELM_VERSION=%s\nK8S_TEST_BINS=%s\n' \
      "$K8S_VERSION" "$ETCD_VERSION" "$HELM_VERSION" "$K8S_TEST_BINS"
    printf 'CONTAINERD_VERSION=%s\nRUNC_VERSION=%s\nNODE_BINS=%s\n' \
      "$CONTAINERD_VERSION" "$RUNC_VERSION" "$NODE_BINS"
  else
    printf '%s\n' "$K8S_TEST_BINS"
  fi
fi
