"""Binding tables, migrations, the write path and the stub inventory reader."""

# The environment variable naming the database. Kept in this light module so the CLI parser can
# name it without importing SQLAlchemy (every probe pod runs that CLI).
URL_ENV = "THOP_DATABASE_URL"
