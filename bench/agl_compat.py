"""The one-line move from Agent Lightning: its scripts run under `lightrail.agl` with the import changed.

Each script of ``tests/agl_migration/`` (written against ``import agentlightning as agl``) is copied with only that
line changed to ``import lightrail.agl as agl`` and run as its user runs it: ``--dev URL`` (a dry run against an
OpenAI-compatible server on 127.0.0.1 standing in for a hosted model: ``lightrail gateway serve --fake``) and
``--train MODEL`` (one training step on the tiny model: VERL's GRPO, or APO for the room selector). A run is ok when
the script exits 0 and every rollout it ran in its store succeeded (and, training, a step was recorded).

Same-run baseline: the same scripts with ``import lightrail as agl`` (lightrail's own API, no face), dry run only;
and the share of the reference's names of the scope that ``lightrail`` itself has.

Names: ``scripts/agl_names.py`` under ``$LIGHTRAIL_AGL_PYTHON`` (agentlightning 0.3.0's venv, `scripts/_env_agl.sh`)
reads the reference's public names; ``agl_public_names_mapped`` is the share of those of the scope (agents,
resources, emitters, trainer, algorithms, datasets) that `lightrail.agl.MAPPED` gives.

    LIGHTRAIL_AGL_PYTHON=... .venv/bin/python bench/agl_compat.py      # ~6 minutes on 2 cores

Prints progress on stderr and one JSON line on stdout.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import REPO, free_port, log  # noqa: E402

SUITE = REPO / "tests" / "agl_migration"
IMPORT = "import agentlightning as agl"


def rewrite(source: str, new_import: str) -> tuple[str, int]:
    """The script with its import line changed, and the number of lines that differ."""
    changed = source.replace(IMPORT + "\n", new_import + "\n")
    diff = [d for d in difflib.ndiff(source.splitlines(), changed.splitlines()) if d[:2] in ("- ", "+ ")]
    return changed, len([d for d in diff if d.startswith("+ ")])


def run_script(source: str, args: list[str], timeout_s: float) -> dict:
    """Run a script in a fresh folder; ok = exit 0, every rollout of its stores succeeded, and (training) a step."""
    with tempfile.TemporaryDirectory(prefix="agl-") as folder:
        path = Path(folder) / "script.py"
        path.write_text(source)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        started = time.monotonic()
        try:
            out = subprocess.run([sys.executable, str(path), *args], cwd=folder, env=env, capture_output=True,
                                 text=True, timeout=timeout_s)  # fmt: skip
            code, tail = out.returncode, (out.stderr or out.stdout).strip().splitlines()[-1:] or [""]
        except subprocess.TimeoutExpired:
            code, tail = -1, ["timeout"]
        statuses: list[str] = []
        for db in glob.glob(f"{folder}/runs/**/store.db", recursive=True):
            with sqlite3.connect(db) as conn:
                statuses += [s for (s,) in conn.execute("SELECT status FROM rollouts")]
        steps = 0
        for metrics in glob.glob(f"{folder}/runs/**/metrics.jsonl", recursive=True):
            steps += sum(
                1
                for line in Path(metrics).read_text().splitlines()
                if '"kind": "train"' in line or '"kind": "round"' in line
            )
        training = "--train" in args
        ok = code == 0 and bool(statuses) and all(s == "succeeded" for s in statuses) and (steps > 0 or not training)
        return {"ok": ok, "exit": code, "rollouts": len(statuses), "succeeded": statuses.count("succeeded"),
                "steps": steps, "seconds": round(time.monotonic() - started, 1), "last_line": tail[0][:300]}  # fmt: skip


def names() -> dict:
    python = os.environ.get("LIGHTRAIL_AGL_PYTHON")
    if not python:
        raise SystemExit("set LIGHTRAIL_AGL_PYTHON (bash scripts/_env_agl.sh prints it)")
    import lightrail
    import lightrail.agl as agl

    found = json.loads(subprocess.run([python, str(REPO / "scripts" / "agl_names.py")], capture_output=True,
                                      text=True, check=True).stdout)["names"]  # fmt: skip
    scope = {n for n, info in found.items() if info["scope"]}
    return {"reference_names": len(found), "scope": len(scope),
            "mapped": round(len(scope & set(agl.MAPPED)) / len(scope), 3),
            "baseline_lightrail": round(len(scope & set(dir(lightrail))) / len(scope), 3),
            "refused_in_scope": sorted(scope - set(agl.MAPPED))}  # fmt: skip


KEYS = ("changed_lines_max", "runs_ok", "baseline_runs_ok", "scripts", "baseline")
NEEDS = {"agl": ("agl_public_names_mapped", "baseline_names_in_lightrail", "names")}
"""The names need agentlightning's venv (``scripts/_env_agl.sh``); the scripts run without it."""


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the first migration script only")
    args = parser.parse_args()
    from bench._util import ServerProcess  # noqa: F401 - the helpers' module loads lightrail's path first
    from lightrail.engine.models import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="agl-bench-"))
    model = build_tiny_model(work / "tiny", size="tiny", seed=0)
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "lightrail.cli", "gateway", "serve", "--fake", "--port",
                                str(port), "--store", str(work / "hosted.db")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    hosted = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(100):
            try:
                import urllib.request

                urllib.request.urlopen(hosted.removesuffix("/v1") + "/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        results, baseline, changed = {}, {}, {}
        for script in sorted(SUITE.glob("*.py"))[: 1 if args.smoke else None]:
            source = script.read_text()
            face, n = rewrite(source, "import lightrail.agl as agl")
            changed[script.stem] = n
            log(f"{script.stem}: dev")
            dev = run_script(face, ["--dev", hosted], 300)
            log(f"{script.stem}: dev {dev}")
            # APO trains a prompt, not weights: its script's --train names the model endpoint it optimizes against
            train = run_script(face, ["--train", hosted if "agl.APO(" in source else str(model)], 600)
            log(f"{script.stem}: train {train}")
            results[script.stem] = {"dev": dev, "train": train}
            plain, _ = rewrite(source, "import lightrail as agl")
            baseline[script.stem] = run_script(plain, ["--dev", hosted], 300)
            log(f"{script.stem}: baseline {baseline[script.stem]}")
    finally:
        gateway.terminate()
        gateway.wait(10)
    runs = [r for arms in results.values() for r in arms.values()]
    # --smoke leaves the names out when agentlightning's venv is not there (NEEDS); a full run requires it
    names_found = names() if os.environ.get("LIGHTRAIL_AGL_PYTHON") or not args.smoke else None
    named = {} if names_found is None else {
        "agl_public_names_mapped": names_found["mapped"],
        "baseline_names_in_lightrail": names_found["baseline_lightrail"],
        "names": names_found,
    }  # fmt: skip
    print(json.dumps({
        "changed_lines_max": max(changed.values()),
        "runs_ok": f"{sum(r['ok'] for r in runs)}/{len(runs)}",
        "baseline_runs_ok": f"{sum(r['ok'] for r in baseline.values())}/{len(baseline)} (import lightrail as agl, dev)",
        **named,
        "scripts": results,
        "baseline": {k: {"ok": v["ok"], "last_line": v["last_line"]} for k, v in baseline.items()},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
