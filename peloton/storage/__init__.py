"""Durable storage: SQLAlchemy models, repositories and Alembic migration helpers."""
