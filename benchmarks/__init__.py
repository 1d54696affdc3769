"""Reproducible benchmarks: each prints a table and writes ``benchmarks/results/<name>.json``."""
