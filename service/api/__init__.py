"""The HTTP API, the top room: one router per resource, their dependencies, who is calling, errors as answers.

``routes`` (one router per resource), ``deps`` (every route dependency as an
``Annotated`` alias), ``auth`` (the project of an API key) and ``throttle``
(failed keys counted per address, across processes), ``fastpath`` (cached
plan responses replayed before FastAPI, with the same access control),
``handlers`` (every exception as one JSON answer) and ``responses`` (the
error answers routes declare). Imports ``service.views``,
``service.solving``, ``service.store``, ``service.transport`` and the
top-level modules; ``service.docs`` is its sibling (``service.main`` joins them).
"""

from service.lazy import exports

__all__ = [
    # routes
    "ROUTERS",
    # handlers
    "AsciiJSONResponse", "install_error_handlers",
    # throttle
    "AuthThrottle",
    # fastpath
    "PlanFastPath", "PlanResponseCache", "CachedResponse",
]

__getattr__ = exports(__name__, ("handlers", "throttle", "fastpath", "routes"), __all__)
