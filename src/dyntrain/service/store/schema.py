"""The service's tables (SQLAlchemy Core)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

metadata = sa.MetaData()
_Id = sa.String(80)
_Name = sa.String(128)
_Serial = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite: an alias of rowid


def _times(*names: str, nullable: bool = False) -> list[sa.Column]:
    return [sa.Column(n, sa.Double, nullable=nullable) for n in names]


def _aws() -> list[sa.Column]:
    """Tags, and the AWS Batch request fields dyntrain keeps only to describe a resource back
    (an image, volumes, a service role): see ``dyntrain.service.aws``. NULL for native ones."""
    return [sa.Column("tags", sa.JSON), sa.Column("aws", sa.JSON)]


compute_environments = sa.Table(
    "compute_environments", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("capacity_type", sa.String(16), nullable=False),
    sa.Column("price_per_slot_hour", sa.Double, nullable=False),
    sa.Column("slot_cpus", sa.Double, nullable=False),
    sa.Column("slot_gpus", sa.Integer, nullable=False),
    sa.Column("slot_memory_mib", sa.Integer, nullable=False),
    sa.Column("min_slots", sa.Integer, nullable=False),
    sa.Column("desired_slots", sa.Integer, nullable=False),
    sa.Column("max_slots", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_reason", sa.Text),
    *_times("created_at", "updated_at"),
    *_aws(),
)

job_queues = sa.Table(
    "job_queues", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("priority", sa.Integer, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    *_times("created_at", "updated_at"),
    *_aws(),
    sa.Column("scheduling_policy", _Name),  # its fair-share policy; None: first in, first out
    sa.Column("preempt_plain_jobs", sa.Boolean),  # fair share may preempt its plain jobs
)

scheduling_policies = sa.Table(  # AWS Batch's fair-share scheduling policies
    "scheduling_policies", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("share_decay_seconds", sa.Integer, nullable=False),
    sa.Column("compute_reservation", sa.Integer, nullable=False),
    sa.Column("share_distribution", sa.JSON, nullable=False),  # [[identifier, weight], ...]
    *_times("created_at", "updated_at"),
    *_aws(),
)

queue_environments = sa.Table(
    "queue_environments", metadata,
    sa.Column("queue", _Name, sa.ForeignKey("job_queues.name", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("compute_environment", _Name, sa.ForeignKey("compute_environments.name"),
              nullable=False, index=True),
    sa.UniqueConstraint("queue", "compute_environment"),
)

job_definitions = sa.Table(
    "job_definitions", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("revision", sa.Integer, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("command", sa.JSON, nullable=False),
    sa.Column("environment", sa.JSON, nullable=False),
    sa.Column("parameters", sa.JSON, nullable=False),
    sa.Column("cpus", sa.Double, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("memory_mib", sa.Integer, nullable=False),
    sa.Column("retry_strategy", sa.JSON, nullable=False),
    sa.Column("timeout_seconds", sa.Double),
    sa.Column("min_workers", sa.Integer),
    sa.Column("max_workers", sa.Integer),
    sa.Column("launcher", sa.String(16)),  # an elastic definition's Launcher; None: dyntrain
    *_times("created_at"),
    *_aws(),
)

jobs = sa.Table(
    "jobs", metadata,
    sa.Column("id", _Id, primary_key=True),
    sa.Column("name", _Name, nullable=False),
    sa.Column("queue", _Name, nullable=False),  # no FK: finished jobs outlive their queue
    sa.Column("definition_name", _Name),
    sa.Column("definition_revision", sa.Integer),
    sa.Column("command", sa.JSON, nullable=False),
    sa.Column("environment", sa.JSON, nullable=False),
    sa.Column("parameters", sa.JSON, nullable=False),
    sa.Column("cpus", sa.Double, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("memory_mib", sa.Integer, nullable=False),
    sa.Column("retry_strategy", sa.JSON, nullable=False),
    sa.Column("timeout_seconds", sa.Double),
    sa.Column("min_workers", sa.Integer),
    sa.Column("max_workers", sa.Integer),
    sa.Column("array_parent_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE")),
    sa.Column("array_index", sa.Integer),
    sa.Column("array_size", sa.Integer),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("status_reason", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("preemptions", sa.Integer, nullable=False),
    sa.Column("exit_code", sa.Integer),
    sa.Column("current_workers", sa.Integer, nullable=False),
    sa.Column("log_seq", sa.Integer, nullable=False),  # last log line's sequence number
    *_times("created_at", "updated_at"),
    *_times("started_at", "stopped_at", nullable=True),
    sa.Column("workdir", sa.Text),  # None: the executor's own working directory
    sa.Column("exported_environment", sa.JSON),  # the submitter's; an array's on its parent only
    sa.Column("progress", sa.JSON),  # an elastic job's latest training metrics
    sa.Column("result", sa.JSON),  # what its training reported (trainer.report())
    *_aws(),
    sa.Column("num_nodes", sa.Integer),  # a multi-node job: its workers, one per node
    sa.Column("launcher", sa.String(16)),  # an elastic job's Launcher; None: dyntrain
    # who submitted it (AWS: the SDK's invocation id): a retried submit finds the job it made
    sa.Column("client_token", sa.String(128)),
    sa.Column("share_identifier", sa.String(255)),  # its share in a fair-share queue
    sa.Column("scheduling_priority", sa.Integer),  # orders a share's jobs (higher first)
    sa.Index("ix_jobs_created", "created_at", "id"),
    sa.Index("ix_jobs_client_token", "client_token", unique=True),
    sa.Index("ix_jobs_queue_status", "queue", "status", "created_at"),
    sa.Index("ix_jobs_status", "status"),
    sa.Index("ix_jobs_parent", "array_parent_id", "array_index"),
)

job_dependencies = sa.Table(
    "job_dependencies", metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("depends_on", _Id, sa.ForeignKey("jobs.id"), primary_key=True, index=True),
    sa.Column("type", sa.String(16), nullable=False),
)

attempts = sa.Table(
    "attempts", metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("attempt_no", sa.Integer, primary_key=True),
    sa.Column("exit_code", sa.Integer),
    sa.Column("reason", sa.Text),
    *_times("started_at"),
    *_times("stopped_at", nullable=True),
)

usage = sa.Table(
    "usage", metadata,
    sa.Column("id", _Serial, primary_key=True, autoincrement=True),
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False,
              index=True),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    sa.Column("compute_environment", _Name, nullable=False),
    sa.Column("capacity_type", sa.String(16), nullable=False),
    sa.Column("worker_seconds", sa.Double, nullable=False),
    sa.Column("price_per_slot_hour", sa.Double, nullable=False),
    sa.Column("wasted", sa.Boolean, nullable=False),
    *_times("recorded_at"),
)

job_logs = sa.Table(
    "job_logs", metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    sa.Column("worker", sa.String(128)),
    sa.Column("line", sa.Text, nullable=False),
    *_times("at"),
)

events = sa.Table(
    "events", metadata,
    sa.Column("id", _Serial, primary_key=True, autoincrement=True),
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE")),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    *_times("at"),
    sa.Index("ix_events_job", "job_id", "id"),
)

workers = sa.Table(
    "workers", metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False,
              index=True),
    sa.Column("attempt_no", sa.Integer, nullable=False),
    sa.Column("compute_environment", _Name, nullable=False),
    sa.Column("capacity_type", sa.String(16), nullable=False),
    sa.Column("price_per_slot_hour", sa.Double, nullable=False),
    sa.Column("handle", sa.JSON),  # the executor's handle, to adopt the worker after a restart
    sa.Column("state", sa.String(16), nullable=False, index=True),  # RUNNING, LEAVING, EXITED
    sa.Column("leave_reason", sa.Text),
    sa.Column("exit_code", sa.Integer),
    *_times("started_at"),
    *_times("leave_at", "stopped_at", nullable=True),
)

capacity_traces = sa.Table(
    "capacity_traces", metadata,
    sa.Column("compute_environment", _Name,
              sa.ForeignKey("compute_environments.name", ondelete="CASCADE"), primary_key=True),
    sa.Column("csv", sa.Text, nullable=False),
    sa.Column("loop", sa.Boolean, nullable=False),
    *_times("started_at"),
)


# Several service replicas on one database (``store/leases.py``): the controller's lease, each
# replica's heartbeat and the terminations a replica that does not lead hands to the one that does.
leases = sa.Table(
    "leases", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("holder", _Name, nullable=False),
    sa.Column("url", sa.Text),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    *_times("acquired_at", "expires_at"),  # the database's clock, never a host's
)

replicas = sa.Table(
    "replicas", metadata,
    sa.Column("name", _Name, primary_key=True),
    sa.Column("url", sa.Text),
    sa.Column("leader", sa.Boolean, nullable=False),
    *_times("started_at", "seen_at"),
)

termination_requests = sa.Table(
    "termination_requests", metadata,
    sa.Column("job_id", _Id, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("reason", sa.Text, nullable=False),
    *_times("requested_at"),
)


def upgrade(conn: Connection) -> list[str]:
    """Bring a database up to these tables; returns what it changed, one line each.

    Missing tables (with their indexes) are created; a table that exists gets the columns it
    lacks, which must be nullable or have a server default (a NOT NULL column without one
    cannot be added to rows that exist), and the indexes it lacks. Nothing is dropped or
    retyped. Run in one transaction, so a failed upgrade changes nothing (PostgreSQL and
    SQLite both roll back DDL).
    """
    inspector = sa.inspect(conn)
    existing = set(inspector.get_table_names())
    changes: list[str] = []
    for table in metadata.sorted_tables:
        if table.name not in existing:
            table.create(conn)
            changes.append(f"created table {table.name}")
            continue
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in have:
                continue
            if not column.nullable and column.server_default is None:
                raise RuntimeError(
                    f"cannot upgrade table {table.name}: its new column {column.name} is NOT "
                    "NULL without a server default, so rows that exist would break")
            ddl = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
            conn.execute(sa.text(f"ALTER TABLE {conn.dialect.identifier_preparer.quote(table.name)}"
                                 f" ADD COLUMN {ddl}"))
            changes.append(f"added column {table.name}.{column.name}")
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(conn)
                changes.append(f"created index {index.name}")
    return changes
