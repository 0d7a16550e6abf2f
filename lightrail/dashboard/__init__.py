"""The dashboard: runs and their curves, rollouts (filtered, paged by the store), one rollout's attempts, span tree,
LLM calls and rewards, resources versions with diffs, the failure digest; live while a run goes.

Served under ``/ui`` next to the store server's API by ``lightrail store serve`` (same tokens) and alone by
``lightrail dashboard --store LOCATION`` in front of any store. Server-rendered (Jinja2) with one small script; nothing is fetched from
elsewhere. See `lightrail.dashboard.app` for the routes and sign-in, `lightrail.dashboard.views` for what each
page reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightrail._lazy import lazy_face

if TYPE_CHECKING:  # the export list (read by `lazy_face`): the command line imports this package, not Starlette
    from lightrail.dashboard.app import create_dashboard_app, dashboard_routes

_EXPORTS, __all__, __getattr__, __dir__ = lazy_face(__name__, __file__)
