"""``GET /docs``: the API's OpenAPI document (``/openapi.json``) in Swagger UI, every file
of it served by the API itself.

FastAPI's own page loads Swagger UI from a CDN, as ``swagger-ui-dist@5`` (a version
that floats, with no integrity hash), and its favicon from FastAPI's site (sending the
API's address as the Referer); offline it is blank. A browser that opened the operator
page keeps the operator's Basic credentials for the whole origin, so a script on /docs
could read /operator: this page runs no script but the API's own files.

Swagger UI (Apache-2.0; 5.32.6 in fastapi-offline 1.7.7) is the ``swagger-ui-bundle.js``
and ``swagger-ui.css`` of swagger-ui-dist as the PyPI package fastapi-offline (MIT;
pinned in docker/constraints.txt) ships them, which :func:`install` serves from its package
directory (only those two and its favicon: the ReDoc it also ships is not served;
/redoc is off). The page starts it with :file:`docs_static/swagger-init.js`, a file
too, not an inline script: the page's Content-Security-Policy (:data:`HEADERS`, the
operator page's with ``connect-src 'self'`` for the document and "Try it out") takes
scripts and styles from this origin only, sends no Referer, and no other site may frame
it; its files are served with the same headers.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse

from hypermedia.errors import NotFound

PATH = "/docs"
ASSETS_PATH = f"{PATH}/static"
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self';"
        " img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none';"
        " frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
SWAGGER_UI_DIR = Path(str(files("fastapi_offline") / "static"))
OWN_DIR = Path(__file__).resolve().parent / "docs_static"
# The files the page loads, and nothing else of either directory.
ASSETS = {
    "swagger-ui-bundle.js": SWAGGER_UI_DIR / "swagger-ui-bundle.js",
    "swagger-ui.css": SWAGGER_UI_DIR / "swagger-ui.css",
    "favicon.png": SWAGGER_UI_DIR / "favicon.png",
    "swagger-init.js": OWN_DIR / "swagger-init.js",
}


def page(title: str, openapi_url: str) -> str:
    """The page: Swagger UI's files, and the document's address for swagger-init.js."""
    from html import escape

    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · API</title>
<link rel="icon" href="{ASSETS_PATH}/favicon.png">
<link rel="stylesheet" href="{ASSETS_PATH}/swagger-ui.css">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{escape(openapi_url)}"></div>
<script src="{ASSETS_PATH}/swagger-ui-bundle.js"></script>
<script src="{ASSETS_PATH}/swagger-init.js"></script>
</body>
</html>
"""


def install(app: FastAPI) -> None:
    """Serve the page at :data:`PATH` of ``app`` (built with ``docs_url=None``) and its
    files under :data:`ASSETS_PATH`, each with :data:`HEADERS`."""
    assert app.openapi_url is not None
    shown = page(app.title, app.openapi_url)

    def docs() -> HTMLResponse:
        return HTMLResponse(shown, headers={**HEADERS, "Cache-Control": "no-cache"})

    def asset(name: str) -> FileResponse:
        found = ASSETS.get(name)
        if found is None:
            raise NotFound(f"no file {name!r} of the API's docs")
        return FileResponse(found, headers=HEADERS)

    app.add_api_route(PATH, docs, methods=["GET"], include_in_schema=False)
    app.add_api_route(
        f"{ASSETS_PATH}/{{name}}", asset, methods=["GET", "HEAD"], include_in_schema=False
    )
