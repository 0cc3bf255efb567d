"""Alembic environment: runs on the engine the gateway hands in (no alembic.ini)."""

from alembic import context

from gateway.db import metadata

engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
