"""Views: what the service shows of stored rows: response bodies, charts, and the processes that draw them.

``bodies`` (stored rows as response bodies, for the routes and the OpenAPI
examples alike), ``charts`` (PNG charts of plans and sweeps) and
``rendering`` (the bounded pool of render processes for charts and other
heavy answers, and the chart cache). Imports ``service.solving``,
``service.store`` and the top-level modules.
"""

from service.lazy import exports

__all__ = [
    # bodies
    "stats_summary", "module_tree_json", "plan_summary", "sweep_point", "sweep_out", "pipeline_plan_out",
    # rendering
    "Renderer", "plan_chart_job", "sweep_chart_job", "pipeline_chart_job", "stats_detail_job", "raise_if_stale",
    # charts
    "plan_chart", "sweep_chart", "pipeline_chart", "ImageFormat",
]

__getattr__ = exports(__name__, ("bodies", "rendering", "charts"), __all__)
