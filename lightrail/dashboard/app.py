"""The dashboard's routes (under ``/ui``), its sign-in and its security headers.

Pages are rendered on the server (Jinja2, autoescaped: text from agents is shown, never run) and ship one small
script (``static/dashboard.js``) for live updates; no CDN, no build step. ``lightrail store serve`` hands these routes
to the store server, which serves them next to its API (`lightrail.cli.store_serve`, the ``ui`` of
`lightrail.store.server.create_app`), and ``lightrail dashboard`` serves them alone in front of any store
(`create_dashboard_app`).

**Auth.** When the server has a token, a page needs a token that may read: the admin token or a ``read``-role token
(`lightrail.store.tokens`), sent as ``Authorization: Bearer`` or, after the sign-in form, as an HttpOnly,
SameSite=Strict cookie scoped to ``/ui``. Without one, a page redirects to the sign-in form; the static files are
public. Every page is a GET that reads; the only writes are signing in and out.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable
from importlib import resources as package_files
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from lightrail.store.base import NotFoundError, Store
from lightrail.store.tokens import ADMIN, DASHBOARD_ROLES, Principal, Verify, token_verifier

__all__ = ["COOKIE", "PREFIX", "create_dashboard_app", "dashboard_routes"]

PREFIX = "/ui"
COOKIE = "lightrail_ui"

_HEADERS = {
    # Scripts and styles only from this server: even text that slipped past escaping could not run a script.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


def _environment() -> Any:
    import jinja2

    from lightrail.dashboard import views

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("lightrail.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(prefix=PREFIX, when=views.when, took=views.took, short=views.short, pretty=views.pretty,
                       statuses=views.STATUSES)  # fmt: skip
    return env


def dashboard_routes(
    get_store: Callable[[], Store], verify: Verify | None, *, secure_cookie: bool = False, tokenizer: str | None = None
) -> list[Route]:
    """The dashboard's routes for an app whose store ``get_store`` returns; ``verify`` says who a token is (None:
    everyone reads). With ``secure_cookie`` bound, this is a store server's ``ui``
    (`lightrail.store.server.UiRoutes`). ``tokenizer`` (a model folder) shows generated tokens as text with their
    logprobs, where the agent did not ask for logprobs itself."""
    import functools

    from lightrail.dashboard import pages, views

    env = _environment()

    def render(request: Request, template: str, code: int = 200, **context: Any) -> Response:
        context.setdefault("live_period_ms", 3000)
        html = env.get_template(template).render(request=request, live=request.query_params.get("live") != "0",
                                                 signed_in=COOKIE in request.cookies, **context)  # fmt: skip
        return HTMLResponse(html, code, headers=_HEADERS)

    async def who(request: Request) -> Principal | None:
        if verify is None:
            return ADMIN
        header = request.headers.get("authorization", "")
        token = header[7:] if header.startswith("Bearer ") else request.cookies.get(COOKIE, "")
        return await verify(token) if token else None

    def page(handler: Callable[..., Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            principal = await who(request)
            if principal is None:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{PREFIX}/login?next={urllib.parse.quote(target)}", 303, headers=_HEADERS)
            if principal.role not in DASHBOARD_ROLES:
                return render(request, "error.html", 403, title="Forbidden",
                              message=f"this token's role is {principal.role.value}; the dashboard needs admin or read")  # fmt: skip
            try:
                return await handler(request, get_store(), render)
            except NotFoundError as exc:
                return render(request, "error.html", 404, title="Not found", message=str(exc))
            except ValueError as exc:  # a bad query parameter
                return render(request, "error.html", 400, title="Bad request", message=str(exc))

        endpoint.__name__ = getattr(handler, "__name__", "page")
        return endpoint

    decoder: list[views.Decode] = []

    def decode(ids: list[int]) -> list[str]:  # the tokenizer loads on the first rollout page that needs it
        if not decoder:
            decoder.append(views.tokenizer_decoder(tokenizer))  # type: ignore[arg-type]  # only with a tokenizer
        return decoder[0](ids)

    def cross_site(request: Request) -> bool:
        """A form posted from another site (signing a user in or out behind their back)."""
        fetched_from = request.headers.get("sec-fetch-site")  # browsers send it; "none": typed or bookmarked
        if fetched_from is not None:
            return fetched_from not in ("same-origin", "none")
        origin = request.headers.get("origin")  # "null" under Referrer-Policy no-referrer: nothing to compare
        return origin not in (None, "null") and urllib.parse.urlsplit(origin).netloc != request.headers.get("host")

    async def login(request: Request) -> Response:
        target = _safe_next(request.query_params.get("next", ""))
        if request.method == "POST" and cross_site(request):
            return render(request, "error.html", 403, title="Forbidden", message="sign in from this dashboard's page")
        if request.method == "GET":
            return render(request, "login.html", title="Sign in", target=target, failed=False)
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        target = _safe_next((form.get("next") or [target])[0])
        principal = await verify(token) if verify is not None and token else ADMIN if verify is None else None
        if principal is None or principal.role not in DASHBOARD_ROLES:
            return render(request, "login.html", 401, title="Sign in", target=target, failed=True)
        response = RedirectResponse(target, 303, headers=_HEADERS)
        if verify is not None:
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path=PREFIX, secure=secure_cookie)
        return response

    async def logout(request: Request) -> Response:
        if cross_site(request):
            return render(request, "error.html", 403, title="Forbidden", message="sign out from this dashboard's page")
        response = RedirectResponse(f"{PREFIX}/login", 303, headers=_HEADERS)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        suffix = name[name.rfind(".") :] if "." in name else ""
        if "/" in name or suffix not in _STATIC_TYPES:
            return Response("not found", 404)
        try:
            body = package_files.files("lightrail.dashboard").joinpath("static", name).read_bytes()
        except FileNotFoundError:
            return Response("not found", 404)
        return Response(body, media_type=_STATIC_TYPES[suffix], headers={**_HEADERS, "Cache-Control": "max-age=300"})

    async def root(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/", 307)

    return [
        Route(PREFIX, root),
        Route(f"{PREFIX}/", page(pages.runs), name="ui_runs"),
        Route(PREFIX + "/runs/{run:path}", page(pages.run), name="ui_run"),
        Route(f"{PREFIX}/rollouts", page(pages.rollouts), name="ui_rollouts"),
        Route(
            PREFIX + "/rollouts/{rollout_id:path}",
            page(functools.partial(pages.rollout, decode=decode if tokenizer else None)),
            name="ui_rollout",
        ),
        Route(f"{PREFIX}/resources", page(pages.resources), name="ui_resources"),
        Route(f"{PREFIX}/failures", page(pages.failures), name="ui_failures"),
        Route(f"{PREFIX}/login", login, methods=["GET", "POST"], name="ui_login"),
        Route(f"{PREFIX}/logout", logout, methods=["POST"], name="ui_logout"),
        Route(PREFIX + "/static/{name}", static, name="ui_static"),
    ]


def _safe_next(target: str) -> str:
    """Where to go after signing in: a dashboard path, never another site."""
    return (
        target
        if target.startswith(f"{PREFIX}/") and not target.startswith("//") and "\\" not in target
        else f"{PREFIX}/"
    )


def create_dashboard_app(
    store: Store | Callable[[], Store],
    *,
    token: str | None = None,
    secure_cookie: bool = False,
    tokenizer: str | None = None,
) -> Any:
    """The dashboard alone in front of ``store`` (any `Store`: a SQLite file, PostgreSQL, a store server through
    `StoreClient`), signed in with ``token`` when given. A factory is called at startup inside the server's loop and
    its store closed at shutdown. ``/`` redirects to ``/ui/``. ``tokenizer``: see `dashboard_routes`."""
    from starlette.applications import Starlette

    from lightrail.store.server import store_lifespan

    get_store, lifespan = store_lifespan(store)
    routes = dashboard_routes(get_store, token_verifier(token), secure_cookie=secure_cookie, tokenizer=tokenizer)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/", 307)

    return Starlette(routes=[Route("/", home), *routes], lifespan=lifespan)
