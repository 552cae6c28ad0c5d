"""Alembic migrations: the only way the service's tables are made (``sacplan db upgrade``)."""
