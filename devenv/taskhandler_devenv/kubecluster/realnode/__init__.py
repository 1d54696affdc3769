"""A real Kubernetes node (kubelet + containerd + runc + CNI) for the test control plane."""

from .check import node_bins, real_node_unavailable
from .node import RealNode, RealNodeError

__all__ = ["RealNode", "RealNodeError", "node_bins", "real_node_unavailable"]
