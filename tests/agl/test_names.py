"""`lightrail.agl` against the installed reference: Agent Lightning 0.3.0's public names, read from the package
itself in its own venv (`scripts/_env_agl.sh`, ``$LIGHTRAIL_AGL_PYTHON``; `scripts/agl_names.py` reads them with
``dir()``/``inspect``), each one mapped or refused, and every mapped one taking the reference's parameters."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
from pathlib import Path

import pytest

import lightrail.agl as agl

ROOT = Path(__file__).resolve().parents[2]

REFUSED_IN_SCOPE = {"Algorithm", "algo", "Task"}
"""The names of the scope (agents, resources, emitters, trainer, algorithms, datasets) that lightrail refuses: a
custom `Algorithm` over Agent Lightning's store, its decorator, and the v0 task type."""


@pytest.fixture(scope="session")
def reference() -> dict:
    python = os.environ.get("LIGHTRAIL_AGL_PYTHON")
    if not python:
        pytest.fail("LIGHTRAIL_AGL_PYTHON is not set: build the reference venv with `bash scripts/_env_agl.sh`",
                    pytrace=False)  # fmt: skip
    out = subprocess.run([python, str(ROOT / "scripts" / "agl_names.py")], capture_output=True, text=True,
                         timeout=300, check=True)  # fmt: skip
    found = json.loads(out.stdout)
    assert found["version"] == "0.3.0"
    return found["names"]


def test_every_public_name_of_the_reference_is_mapped_or_refused(reference):
    unclassified = sorted(set(reference) - set(agl.MAPPED) - set(agl.REFUSED))
    assert unclassified == []
    assert set(agl.MAPPED) & set(agl.REFUSED) == set()
    assert len(reference) >= 100  # the package was read, not an empty module


def test_at_least_nine_in_ten_names_of_the_scope_are_mapped(reference):
    scope = {n for n, info in reference.items() if info["scope"]}
    mapped = scope & set(agl.MAPPED)
    assert scope - mapped == REFUSED_IN_SCOPE
    assert len(mapped) / len(scope) >= 0.9


def test_every_mapped_name_takes_the_reference_parameters_and_methods(reference):
    """For the names of the scope (the accepted-and-unused ones, tracers, stores, strategies, are only taken as
    arguments)."""
    missing = []
    for name, info in sorted(reference.items()):
        if name not in agl.MAPPED or not info["scope"]:
            continue
        face = getattr(agl, name)
        if info["params"]:
            params = inspect.signature(face).parameters
            takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
            missing += [f"{name}({p}=)" for p in info["params"] if p not in params and not takes_any]
        for method in info["methods"]:
            found = inspect.getattr_static(face, method, None)
            if not (callable(found) or isinstance(found, property)):  # lightrail's `is_async` is both
                missing.append(f"{name}.{method}")
    assert missing == [], "\n".join(missing)


def test_every_refused_name_says_in_one_line_what_lightrail_does_instead(reference):
    for name in sorted(set(reference) & set(agl.REFUSED)):
        with pytest.raises(AttributeError) as info:
            getattr(agl, name)
        message = str(info.value)
        assert message.startswith(f"agl.{name} is not in lightrail: ") and "\n" not in message
