"""A real Kubernetes control plane for the tests, plus a process node standing in for a kubelet.

``bins`` finds and checks the binary cache, ``certs`` makes the PKI, ``control_plane`` starts
etcd, kube-apiserver, kube-controller-manager and the node; ``process_node`` is the node itself
(run as its own process). See docs/testing-kubernetes.md.
"""
