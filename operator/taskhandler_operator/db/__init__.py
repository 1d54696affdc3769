"""Binding tables, migrations, the write path and the stub inventory reader."""
