"""The environments scripts/_env.sh and scripts/_env_frameworks.sh build install only pinned packages: each extra an environment installs has every
one of its requirements pinned in that environment's constraints file (an unpinned one installs whatever is newest
on the day, as opentelemetry-util-genai did in the CrewAI environment)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_MAIN_EXTRAS = re.compile(r'^ALL_EXTRAS="(?P<extras>[\w,-]+)"$', re.M)
"""The main environment's extras (scripts/_env.sh installs them, or the part of them its caller names)."""
_FRAMEWORK = re.compile(
    r'^_lightrail_framework_venv "\S+" "\$FW_ROOT/(?P<constraints>[\w.-]+)" (?P<extra>[\w-]+)$', re.M
)


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _environments() -> list[tuple[str, list[str]]]:
    main = (ROOT / "scripts/_env.sh").read_text()
    assert '-c "$ROOT/constraints.txt" -e "$ROOT${EXTRAS:+[$EXTRAS]}"' in main  # EXTRAS: some of ALL_EXTRAS
    found = [("constraints.txt", m["extras"].split(",")) for m in _MAIN_EXTRAS.finditer(main)]
    # the framework environments: `_lightrail_framework_venv VENV CONSTRAINTS EXTRA` installs [openai,otel,EXTRA]
    frameworks = (ROOT / "scripts/_env_frameworks.sh").read_text()
    assert '-e "$FW_ROOT[openai,otel,$extras]"' in frameworks
    found += [(m["constraints"], ["openai", "otel", m["extra"]]) for m in _FRAMEWORK.finditer(frameworks)]
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


# What a GPU machine's image typically ships (the H200 image: CUDA torch 2.11, transformers 5.17): `pip install
# lightrail[train]` there must keep them, not replace them with the test environment's pins.
_GPU_IMAGE = {"torch": "2.11.0+cu128", "transformers": "5.17.0"}


def test_train_declares_ranges_that_keep_a_gpu_images_torch_and_include_the_tests_pins():
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    train = {_name(r): Requirement(r) for r in project["optional-dependencies"]["train"]}
    pins = {
        _name(line): line.split("==", 1)[1].strip()
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    }
    for name, version in _GPU_IMAGE.items():
        assert train[name].specifier.contains(version), f"{name} {version} is outside train's {train[name]}"
    for name in ("torch", "transformers", "peft"):
        assert train[name].specifier.contains(pins[name]), f"constraints.txt pins {name} outside {train[name]}"
        assert "==" not in str(train[name].specifier), f"train pins {name} ({train[name]}): a range, not a pin"


def test_the_demo_installs_a_part_of_the_main_environment():
    """`scripts/demo` asks `_env.sh` for fewer extras than the tests (a faster first run); each is one of the main
    environment's, so every requirement it installs is pinned (the test above)."""
    demo = re.search(
        r'LIGHTRAIL_PARTS="\$\{LIGHTRAIL_PARTS:-(?P<parts>[\w,-]+)\}"', (ROOT / "scripts/demo").read_text()
    )
    assert demo is not None
    main = _MAIN_EXTRAS.search((ROOT / "scripts/_env.sh").read_text())
    assert main is not None
    assert set(demo["parts"].split(",")) <= set(main["extras"].split(",")) | {"data"}, demo["parts"]
    assert "train" in demo["parts"].split(",")
