"""Docs: the OpenAPI document, the Swagger UI and ReDoc pages, and the response examples they show.

``openapi`` (the document as the pages show it: limits, security and error
answers as this service gives them), ``pages`` (``/docs`` and ``/redoc``,
their assets served from here) and ``response_examples`` (made by the real
planner from the example requests). Imports ``service.views``,
``service.solving``, ``service.store``, ``service.transport`` and the
top-level modules.
"""

from service.lazy import exports

__all__ = [
    # openapi
    "install_openapi",
    # pages
    "install_docs", "DOCS_URL", "REDOC_URL", "DOCS_STATIC_URL", "IMAGES_FROM_HERE",
    # response_examples
    "response_examples", "as_stored",
]

__getattr__ = exports(__name__, ("pages", "openapi", "response_examples"), __all__)
