"""The dashboard: runs and their curves, rollouts (filtered, paged by the store), one rollout's attempts, span tree,
LLM calls and rewards, resources versions with diffs, the failure digest; live while a run goes.

Served under ``/ui`` next to the store server's API by ``lightrail store serve`` (same tokens) and alone by
``lightrail dashboard --store LOCATION`` in front of any store. Server-rendered (Jinja2) with one small script; nothing is fetched from
elsewhere. See `lightrail.dashboard.app` for the routes and sign-in, `lightrail.dashboard.views` for what each
page reads.
"""

from __future__ import annotations

__all__ = ["create_dashboard_app", "dashboard_routes"]


def __getattr__(name: str):  # lazily: the command line imports this package to build --help, not Starlette
    if name in __all__:
        from lightrail.dashboard import app

        return getattr(app, name)
    raise AttributeError(name)
