"""The documentation site (mkdocs.yml, docs/) builds in strict mode, so a link to a page or anchor that does not
exist, or an API entry naming something the code no longer defines, fails the suite; and the README, which the
site does not build, links only to files and anchors that exist.

The real ``mkdocs build --strict`` in a subprocess, into a temporary folder (the repository's ``site/`` untouched).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project``'s mkdocs.yml into ``site``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, not a finding
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_docs_build_strictly(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site/api/index.html").read_text().count("doc-heading") > 20  # the docstrings were read


@pytest.mark.parametrize(
    ("page", "added", "reported"),
    [
        ("gpus.md", "[x](no-such-page.md)", "no-such-page.md"),
        ("gpus.md", "[x](scaling-out.md#no-such-anchor)", "no-such-anchor"),
        ("api.md", "::: lightrail.types.NoSuchName", "NoSuchName"),
    ],
)
def test_a_broken_link_or_stale_reference_fails_the_build(tmp_path, page, added, reported):
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    (project / "lightrail").symlink_to(ROOT / "lightrail")  # mkdocstrings reads the package from `paths: [.]`
    with (project / "docs" / page).open("a") as f:
        f.write(f"\n{added}\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0 and reported in done.stderr, done.stderr


def _anchors(page: Path) -> set[str]:
    from markdown.extensions.toc import slugify

    headings = re.findall(r"^#{1,6} (.+)$", page.read_text(), flags=re.MULTILINE)
    return {slugify(re.sub(r"[`*]", "", heading), "-") for heading in headings}


def test_every_relative_link_in_the_readme_resolves():
    for target in _LINK.findall((ROOT / "README.md").read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(ROOT / path), f"README links to {target}, an anchor {path} does not have"


def test_the_readme_keeps_the_two_commands_and_ci_runs_its_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "scripts/demo      # the main job: train the bundled calculator agent with GRPO on the CPU\n" in readme
    assert "scripts/test      # the test suite (what CI runs)\n" in readme
    assert "bash scripts/test " in (ROOT / ".ci/run").read_text()
