"""Binding tables, migrations, claims, the write path and the stub inventory reader."""
