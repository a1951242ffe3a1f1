"""The explorer's routes (FastAPI), rendering ``pages``' values with the Jinja2 ``templates/``.

    /           the funnel: every step and reason a link to its images
    /images     a gallery: status, step, reason, source, ranges (min.<column>, max.<column>), sort, page
    /image      one image (key=...): its manifest row, boxes, duplicate family, neighbours, annotations
    /thumb      a thumbnail (key=..., side=200|640), made from the row's shard or source, cached
    /changes    with --against: images whose fate differs, by (A's fate -> B's fate), and why

Parameters are checked against the version (``explore_filters``): a bad one is a 400 and an
unknown key or page a 404, each with the reason in the body; any other failure is a 500 (a bug).
The API schema pages FastAPI would add are off: the app serves HTML and thumbnails only.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from curation.audit.explore_filters import QueryError, check_params, positive_int
from curation.audit.explore_query import THUMB_COLUMNS
from curation.audit.explore_thumbs import SIDES
from curation.audit.page import CSS
from pipelines.explorer import pages
from pipelines.explorer.session import ExploreSession

TEMPLATES = Path(__file__).parent / "templates"
EXTRA_CSS = """
header nav{margin-top:8px} header nav a{color:#f0f4f8;margin-right:14px}
a{color:#0b5cad} .card a{color:inherit;text-decoration:none}
form.filters{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:end}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#52606d}
form.filters input[type=number]{width:90px}
.pager{margin:12px 0;display:flex;gap:16px;align-items:center}
figure.tile a img{border:0}
img.big{max-width:640px;max-height:640px;display:block}
.error-box{background:#fde8e8;border-left:4px solid #c62828;padding:10px 14px}
"""


def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    env.globals.update(css=CSS + EXTRA_CSS, url=pages.url)
    return env


def render(env: Environment, s: ExploreSession, name: str, values: dict, status: int = 200) -> HTMLResponse:
    head = {"v": s.version, "changes": s.changes is not None, "against": s.against.version if s.against else None}
    return HTMLResponse(env.get_template(name).render(**head, **values), status_code=status)


def thumbnail(s: ExploreSession, params) -> Response:
    check_params(params, lambda name: name in ("key", "side", "of"))
    side = s.side(params.get("of") or "")
    size = positive_int(params, "side", SIDES[0])
    if size not in SIDES:
        raise QueryError(f"side: {size} is not one of {', '.join(map(str, SIDES))}")
    key = params.get("key") or ""
    row = side.query.row(key, THUMB_COLUMNS) if key else None
    if row is None:
        raise LookupError(f"key: {key!r} is not an image of version {side.version.id}")
    jpeg, why = side.thumbs.jpeg(row, size)
    headers = {"Cache-Control": "max-age=3600"}
    if why:
        headers["X-Placeholder"] = why[:200].encode("ascii", "replace").decode()
    return Response(jpeg, media_type="image/jpeg", headers=headers)


def create_app(s: ExploreSession) -> FastAPI:
    """The explorer's app over session ``s``."""
    app = FastAPI(title="humanvision explorer", docs_url=None, redoc_url=None, openapi_url=None)
    env = environment()

    def html(name: str, make):
        def route(request: Request) -> HTMLResponse:
            return render(env, s, name, make(s, request.query_params))

        return route

    app.get("/", response_class=HTMLResponse)(html("funnel.html", _funnel))
    app.get("/images", response_class=HTMLResponse)(html("gallery.html", pages.gallery_page))
    app.get("/image", response_class=HTMLResponse)(html("image.html", pages.image_page))
    app.get("/changes", response_class=HTMLResponse)(html("changes.html", pages.changes_page))

    @app.get("/thumb")
    def thumb(request: Request) -> Response:
        return thumbnail(s, request.query_params)

    @app.exception_handler(QueryError)
    def bad_request(request: Request, err: QueryError) -> HTMLResponse:
        return render(env, s, "error.html", {"title": "Bad request", "message": str(err), "code": 400}, 400)

    @app.exception_handler(LookupError)
    def not_found(request: Request, err: LookupError) -> HTMLResponse:
        message = err.args[0] if err.args else str(err)
        return render(env, s, "error.html", {"title": "Not found", "message": message, "code": 404}, 404)

    return app


def _funnel(s: ExploreSession, params) -> dict:
    """The funnel takes no parameter: any given one is refused."""
    check_params(params, lambda name: False)
    return pages.funnel_page(s)
