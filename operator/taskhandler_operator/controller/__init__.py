"""Reconcile loop, kopf wiring, artifact server and metrics."""
