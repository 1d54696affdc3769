"""Alembic history of the operator's tables (version table ``thop_alembic_version``)."""
