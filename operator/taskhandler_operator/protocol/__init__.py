"""Frames, message models and the probe driver (supervisor side of the Lang-SDK protocol)."""
