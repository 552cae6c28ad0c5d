"""Swagger UI and ReDoc served from this server, with no CDN: GPU clusters are often air-gapped.

The assets (Swagger UI's bundle and CSS, ReDoc's standalone bundle, a favicon)
come from the ``fastapi-offline`` package, a dependency, and are mounted under
:data:`DOCS_STATIC_URL`; the pages are FastAPI's own, pointed at them. Like
the OpenAPI document, the pages and assets need no API key.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["DOCS_STATIC_URL", "DOCS_URL", "IMAGES_FROM_HERE", "REDOC_URL", "install_docs"]

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
DOCS_STATIC_URL = "/static/docs"
# ReDoc's bundle shows its maker's logo from their CDN (cdn.redoc.ly/redoc/logo-mini.svg) whatever the
# options; forbidding images from elsewhere keeps that request in the browser, and ReDoc hides the logo.
IMAGES_FROM_HERE = {"Content-Security-Policy": "img-src 'self' data:"}
# fastapi-offline ships the files here: swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png.
_ASSETS = files("fastapi_offline") / "static"


def install_docs(app: FastAPI) -> None:
    """Add ``/docs`` (with its OAuth2 redirect) and ``/redoc`` to ``app``, made with ``docs_url=None, redoc_url=None``;
    ``/`` leads to ``/docs``."""
    assert app.docs_url is None and app.redoc_url is None, "FastAPI's own pages would load a CDN"
    app.mount(DOCS_STATIC_URL, StaticFiles(directory=str(_ASSETS)), name="docs-static")
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url or f"{DOCS_URL}/oauth2-redirect"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth2_redirect_url}",
            init_oauth=app.swagger_ui_init_oauth,
            swagger_js_url=f"{root}{DOCS_STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_STATIC_URL}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )
        page.headers.update(IMAGES_FROM_HERE)
        return page

    @app.get("/", include_in_schema=False)
    async def home(request: Request) -> RedirectResponse:
        return RedirectResponse(f"{request.scope.get('root_path', '').rstrip('/')}{DOCS_URL}")

    @app.get(oauth2_redirect_url, include_in_schema=False)
    async def swagger_ui_oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_STATIC_URL}/favicon.png",
            with_google_fonts=False,  # fonts.googleapis.com: unreachable offline; ReDoc falls back to system fonts
        )
        page.headers.update(IMAGES_FROM_HERE)
        return page
