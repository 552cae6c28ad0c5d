"""The service's version (the planner has its own, part of every plan cache key)."""

SERVICE_VERSION = "0.1.0"
