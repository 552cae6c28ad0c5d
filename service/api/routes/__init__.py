"""One router per resource."""

from service.api.routes import health, plans, stats, sweeps

__all__ = ["ROUTERS"]

# In the order the OpenAPI document lists them.
ROUTERS = (health.router, stats.router, plans.router, sweeps.router)
