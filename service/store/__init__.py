"""The store: the database and what is kept in it, below solving and above transport.

``db`` (engine, sessions, the write gate, schema upgrades by the migrations),
``models`` (the typed SQLAlchemy tables), ``ids`` (opaque row ids), and the
rows of each resource: ``stats`` (uploads, validated and stored once per
content hash), ``plans`` (the plan cache: keys, lookups, stored plans as
served), ``request_bodies`` (plan and sweep requests carrying inline stats),
``sweeps`` and ``pipelines`` (a pipeline's per-stage plans). Imports
``service.transport`` (the upload limits) and the top-level modules, never a
room above it.
"""

from service.lazy import exports

__all__ = [
    # ids
    "ID_LENGTH", "ID_PATTERN", "new_id", "is_id", "shown_id", "EXAMPLE_IDS",
    # models
    "Base", "StatsRecord", "StatsTag", "PlanRecord", "SweepRecord", "PipelinePlanRecord", "SolveClaim", "AuthFailure",
    "utcnow",
    # db
    "make_engine", "make_sessionmaker", "session_scope", "insert_or_get", "write_gate", "upgrade", "Upgraded",
    "alembic_config", "redacted_url", "head_revision",
    # plans
    "CachedPlan", "plan_json", "plan_cache_key", "get_plan", "find_plans", "store_plans",
    # stats
    "get_stats", "stats_document", "new_stats_record", "stats_row_fields", "keep_stats", "store_stats",
    "store_stats_body", "prepare_body_job", "stats_id_of", "spooled", "keep_spooled", "in_render_process",
    "raise_unless_ok", "parse_body_file", "stats_columns", "OutOfTime", "database_of", "keep_spooled_job",
    # request_bodies
    "store_request_body", "prepare_request_job", "StatsNotInTime", "claim",
    # sweeps
    "keep_sweep", "get_sweep",
    # pipelines
    "keep_pipeline_plan", "get_pipeline_plan",
    # ranges
    "column_bounds", "check_in_range",
]

__getattr__ = exports(__name__, ("ids", "models", "db", "plans", "stats", "request_bodies", "sweeps", "pipelines",
                                 "ranges"), __all__)
