"""Print Agent Lightning's public names as JSON, read from the installed package (run it with the interpreter of
the venv `scripts/_env_agl.sh` builds, ``$LIGHTRAIL_AGL_PYTHON``); tests/agl/test_names.py and bench/agl_compat.py
compare `lightrail.agl` against it. Nothing here is a copied list: every name comes from ``dir(agentlightning)``.

Output: ``{"version", "names": {name: {"kind", "scope", "params", "methods"}}}`` where ``scope`` is True for the
names that concern agents, resources, emitters, the trainer, algorithms and datasets: the ``__all__`` of the
subpackages ``litagent``, ``types.resources``, ``emitter``, ``trainer`` and ``algorithm``, plus the names of
``types.core`` their signatures mention (transitively: ``Rollout``, ``Dataset``, ``Hook``...). ``params``: the
keyword-capable parameter names of a callable (a class's ``__init__``); ``methods``: a class's own public methods.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
import contextlib

import agentlightning as agl  # noqa: E402

SCOPE = ("litagent", "types.resources", "emitter", "trainer", "algorithm")


def _signatures(obj: object) -> str:
    targets = [obj]
    if inspect.isclass(obj):
        targets += [v for k, v in vars(obj).items() if not k.startswith("_") or k == "__init__"]
    out = []
    for target in targets:
        target = getattr(target, "__func__", target)
        if callable(target):
            with contextlib.suppress(TypeError, ValueError):
                out.append(str(inspect.signature(target)))
    return " ".join(out)


def _params(obj: object) -> list[str]:
    try:
        sig = inspect.signature(obj)  # a class: its constructor
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in sig.parameters.items() if p.kind in kinds and not n.startswith("_") and n != "self"]


def _methods(obj: object) -> list[str]:
    if not inspect.isclass(obj) or obj.__module__.startswith("typing"):
        return []
    own = [k for k, v in vars(obj).items() if not k.startswith("_") and callable(getattr(v, "__func__", v))]
    return sorted(own) if not hasattr(obj, "model_fields") else []  # pydantic models: fields, not methods


def main() -> None:
    direct: set[str] = set()
    for sub in SCOPE:
        direct |= set(importlib.import_module(f"agentlightning.{sub}").__all__)
    core = set(importlib.import_module("agentlightning.types.core").__all__)
    scope = set(direct)
    while True:
        text = " ".join(_signatures(getattr(agl, n)) for n in sorted(scope) if hasattr(agl, n))
        more = {n for n in core if re.search(rf"\b{re.escape(n)}\b", text)} - scope
        if not more:
            break
        scope |= more
    names = {}
    for name in dir(agl):
        obj = getattr(agl, name)
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "alias"
        names[name] = {"kind": kind, "scope": name in scope, "params": _params(obj) if kind != "alias" else [],
                       "methods": _methods(obj)}  # fmt: skip
    json.dump({"version": importlib.metadata.version("agentlightning"), "names": names}, sys.stdout)


if __name__ == "__main__":
    main()
