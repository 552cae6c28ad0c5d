"""The planner's version: part of every plan cache key."""

PLANNER_VERSION = "0.7.7"
