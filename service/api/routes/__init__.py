"""One router per resource."""

from service.api.routes import health, pipeline_plans, plans, stats, sweeps

__all__ = ["ROUTERS"]

# In the order the OpenAPI document lists them.
ROUTERS = (health.router, stats.router, plans.router, sweeps.router, pipeline_plans.router)
