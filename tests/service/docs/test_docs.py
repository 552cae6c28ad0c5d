"""Swagger UI and ReDoc work offline: the pages name only this server, and it serves every asset they name."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from service.docs import DOCS_STATIC_URL
from service.main import create_app

KEY = "key-docs-0123456789abcdef"
# Every absolute or protocol-relative URL in a page: a CDN, Google Fonts, ...
ABSOLUTE_URL = re.compile(r"""(?:https?:)?//[^\s'"<>()]+""", re.IGNORECASE)
# Swagger UI's page reads the OpenAPI document from its inline script: SwaggerUIBundle({url: '/openapi.json', ...}).
SCRIPT_URL = re.compile(r"""\burl:\s*['"]([^'"]+)['"]""")
JS = ("text/javascript", "application/javascript")
FAVICON = ("image/png", "image/x-icon", "image/vnd.microsoft.icon")


class _References(HTMLParser):
    """(tag, attribute, URL) of every resource a page loads or links to."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "spec-url") and value:
                self.found.append((tag, name, value))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.found += [("script", "url", url) for url in SCRIPT_URL.findall(data)]


def references(html: str) -> list[tuple[str, str, str]]:
    parser = _References()
    parser.feed(html)
    parser.close()
    return parser.found


def expected_type(tag: str, attribute: str, url: str) -> tuple[str, ...]:
    """The content types a reference must answer with, by what the page does with it."""
    path = urlsplit(url).path
    if tag == "script" and attribute == "src":
        return JS
    if tag == "link" and path.endswith(".css"):
        return ("text/css",)
    if tag == "link":  # rel="shortcut icon"
        return FAVICON
    return ("application/json",)  # the OpenAPI document (Swagger UI's url, ReDoc's spec-url)


@pytest.fixture
def keyed_client(make_client, settings):
    """The service with API keys: the docs must still need none."""
    return make_client(settings.model_copy(update={"api_keys": {KEY: "alpha"}}))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_name_only_this_server(keyed_client, page):
    r = keyed_client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert ABSOLUTE_URL.findall(r.text) == [], "the page would load from another host"
    assert r.headers["content-security-policy"] == "img-src 'self' data:"  # ReDoc's own logo stays unloaded
    refs = references(r.text)
    kinds = {(tag, attribute) for tag, attribute, _ in refs}
    assert ("script", "src") in kinds and ("link", "href") in kinds  # a bundle and the favicon at least
    for tag, attribute, url in refs:
        assert urlsplit(url).netloc == "" and url.startswith("/"), url
        answer = keyed_client.get(urljoin(page, url))  # no Authorization header
        assert answer.status_code == 200, (url, answer.status_code)
        content_type = answer.headers["content-type"].split(";")[0].strip()
        assert content_type in expected_type(tag, attribute, url), (url, content_type)
        assert len(answer.content) > 0, url


def test_docs_assets_are_the_packaged_builds(client):
    """The real bundles, not stubs: Swagger UI 5 and ReDoc, with the favicon a PNG."""
    swagger = client.get(f"{DOCS_STATIC_URL}/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in swagger.text and len(swagger.content) > 500_000
    assert ".swagger-ui" in client.get(f"{DOCS_STATIC_URL}/swagger-ui.css").text
    redoc = client.get(f"{DOCS_STATIC_URL}/redoc.standalone.js")
    assert "Redoc" in redoc.text and len(redoc.content) > 500_000
    assert client.get(f"{DOCS_STATIC_URL}/favicon.png").content[:8] == b"\x89PNG\r\n\x1a\n"
    assert client.get(f"{DOCS_STATIC_URL}/../docs.py").status_code == 404
    assert client.get(f"{DOCS_STATIC_URL}/").status_code == 404  # no directory listing


def test_oauth2_redirect_and_openapi_need_no_key(keyed_client):
    page = keyed_client.get("/docs").text
    assert "oauth2RedirectUrl: window.location.origin + '/docs/oauth2-redirect'" in page
    redirect = keyed_client.get("/docs/oauth2-redirect")
    assert redirect.status_code == 200 and "oauth2" in redirect.text.lower()
    assert ABSOLUTE_URL.findall(redirect.text) == []
    assert keyed_client.get("/openapi.json").status_code == 200
    assert keyed_client.get("/v1/stats").status_code == 401  # the API itself still needs one


def test_docs_stay_out_of_the_openapi_document(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc", "/static"))]


def test_docs_under_a_root_path(settings, solver):
    """Behind a proxy that strips a prefix, the pages name their assets under that prefix."""
    with TestClient(create_app(settings, solver=solver), root_path="/sacplan") as client:
        html = client.get("/docs").text
        assert f'src="/sacplan{DOCS_STATIC_URL}/swagger-ui-bundle.js"' in html
        assert "url: '/sacplan/openapi.json'" in html
        assert f'src="/sacplan{DOCS_STATIC_URL}/redoc.standalone.js"' in client.get("/redoc").text
