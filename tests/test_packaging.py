"""The environments scripts/_env.sh builds install only pinned packages: each extra an environment installs has every
one of its requirements pinned in that environment's constraints file (an unpinned one installs whatever is newest
on the day, as opentelemetry-util-genai did in the CrewAI environment)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_INSTALL = re.compile(r'-c "\$ROOT/(?P<constraints>[\w.-]+)" -e "\$ROOT\[(?P<extras>[\w,-]+)\]"')


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _environments() -> list[tuple[str, list[str]]]:
    found = [
        (m["constraints"], m["extras"].split(",")) for m in _INSTALL.finditer((ROOT / "scripts/_env.sh").read_text())
    ]
    assert {constraints for constraints, _ in found} == {
        "constraints.txt",
        "constraints-crewai.txt",
        "constraints-sk.txt",
    }, found
    return found


@pytest.mark.parametrize(("constraints", "extras"), _environments())
def test_every_requirement_an_environment_installs_is_pinned_there(constraints, extras):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = {
        _name(line)
        for line in (ROOT / constraints).read_text().splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    wanted = {_name(r) for r in project["dependencies"]}
    for extra in extras:
        wanted |= {_name(r) for r in project["optional-dependencies"][extra]}
    assert sorted(wanted - pinned) == [], f"{constraints} pins none of these"
