"""``/docs``: Swagger UI from the package's own files (``canal_server/static/swagger-ui``,
vendored, mounted at ``/static`` by the app): nothing is loaded from the network."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

__all__ = ["STATIC_DIR", "SWAGGER_UI", "router"]

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
SWAGGER_UI = "/static/swagger-ui"

router = APIRouter()


@router.get("/docs", include_in_schema=False)
async def docs(request: Request) -> HTMLResponse:
    app = request.app
    return get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json",
        title=f"{app.title} - Swagger UI",
        swagger_js_url=f"{SWAGGER_UI}/swagger-ui-bundle.js",
        swagger_css_url=f"{SWAGGER_UI}/swagger-ui.css",
        swagger_favicon_url=f"{SWAGGER_UI}/favicon-32x32.png",
        swagger_ui_parameters={"validatorUrl": None},  # no badge from an online validator
    )
