"""Reading a /metrics page (Prometheus text format) with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample(page: str, name: str, **labels: str) -> float:
    """The value of sample ``name`` with ``labels`` (0.0 when the page has none: a counter not yet counted)."""
    total = 0.0
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
