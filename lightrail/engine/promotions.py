"""Promoted policies: the versions a serving gateway may serve, in a folder, the current one named by a file.

(Not to be confused with ``grpo.policies``, `lightrail.algorithms.policies`: one trained policy per group of agents
within a run.) `lightrail learn` promotes into the folder; the engine behind ``gateway serve --policies`` follows it.

Layout of a policies folder::

    policies/
      current.json      {"current": {...}, "history": [{...}, ...]}  (replaced atomically, never edited in place)
      v0001/            a servable model folder (`lightrail export --merge` output) per learned candidate
      v0002/
      learn_state.json  what `lightrail learn` has consumed (its cursor, its baseline)
      metrics.jsonl     one line per learn round

Versions only grow. Version 0 is the initial model (its folder is referenced, not copied); each learned candidate
gets the next number whether or not the gate promotes it; `rollback` promotes the previous policy's folder again
under a new version number, so a serving gateway's ``policy_version`` (recorded on every call) never goes back and
always names one set of weights.

`PolicyWatcher` is the serving side (``lightrail gateway serve --policies DIR``): it polls ``current.json`` and
swaps a newer promoted policy into the embedded engine with `Engine.update_weights`, which drains in-flight
generations first: requests in flight finish on the old weights, requests that arrive during the copy wait and
run on the new ones, none fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["PolicyRegistry", "PolicyVersion", "PolicyWatcher"]

log = logging.getLogger(__name__)

CURRENT = "current.json"


class PolicyVersion(msgspec.Struct, kw_only=True):
    """One promoted policy: its version, its servable folder, and how it got there."""

    version: int
    path: str
    kind: str = "learned"
    """``initial`` (the model the registry started from), ``learned`` (a gated candidate) or ``rollback``."""
    val_success: float | None = None
    """Held-out success the gate measured for it (None for an initial model the gate has not measured yet)."""
    promoted_at: float = msgspec.field(default_factory=time.time)
    note: str = ""


class _Registry(msgspec.Struct, kw_only=True):
    current: PolicyVersion
    history: list[PolicyVersion] = msgspec.field(default_factory=list)
    """Every promotion, oldest first (the current one last)."""
    next_version: int = 1


_decode = msgspec.json.Decoder(_Registry).decode


class PolicyRegistry:
    """A policies folder (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def file(self) -> Path:
        return self.root / CURRENT

    def _read(self) -> _Registry | None:
        try:
            return _decode(self.file.read_bytes())
        except FileNotFoundError:
            return None

    def _write(self, registry: _Registry) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_bytes(msgspec.json.format(msgspec.json.encode(registry), indent=2))
        os.replace(tmp, self.file)  # readers see the old file or the new one, never half of one

    def current(self) -> PolicyVersion | None:
        registry = self._read()
        return None if registry is None else registry.current

    def history(self) -> list[PolicyVersion]:
        registry = self._read()
        return [] if registry is None else list(registry.history)

    def init(self, model: str | os.PathLike[str]) -> PolicyVersion:
        """Start the registry from ``model`` (version 0) unless it exists; returns the current policy."""
        registry = self._read()
        if registry is not None:
            return registry.current
        first = PolicyVersion(version=0, path=str(Path(model).resolve()), kind="initial")
        self._write(_Registry(current=first, history=[first]))
        return first

    def reserve(self) -> tuple[int, Path]:
        """The next version number and the folder its candidate goes to (numbers are never reused)."""
        registry = self._require()
        version = registry.next_version
        registry.next_version += 1
        self._write(registry)
        return version, self.root / f"v{version:04d}"

    def record_val(self, version: int, val_success: float) -> None:
        """Remember the gate's measurement of the current policy (so the next round need not measure it again)."""
        registry = self._require()
        if registry.current.version == version:
            registry.current.val_success = val_success
            registry.history[-1] = registry.current
            self._write(registry)

    def promote(
        self, version: int, path: str | os.PathLike[str], *, val_success: float | None, note: str = ""
    ) -> PolicyVersion:
        registry = self._require()
        if version <= registry.current.version:
            raise ValueError(f"version {version} is not newer than the current {registry.current.version}")
        promoted = PolicyVersion(version=version, path=str(Path(path).resolve()), val_success=val_success, note=note)
        registry.current = promoted
        registry.history.append(promoted)
        registry.next_version = max(registry.next_version, version + 1)
        self._write(registry)
        return promoted

    def rollback(self) -> PolicyVersion:
        """Serve the policy before the current one again, as a new version; raises if there is none."""
        registry = self._require()
        earlier = [p for p in registry.history if p.path != registry.current.path]
        if not earlier:
            raise ValueError(f"{self.root}: no earlier policy to roll back to")
        target = earlier[-1]
        version = registry.next_version
        restored = PolicyVersion(
            version=version,
            path=target.path,
            kind="rollback",
            val_success=target.val_success,
            note=f"rollback from v{registry.current.version} to the weights of v{target.version}",
        )
        registry.current = restored
        registry.history.append(restored)
        registry.next_version = version + 1
        self._write(registry)
        return restored

    def _require(self) -> _Registry:
        registry = self._read()
        if registry is None:
            raise FileNotFoundError(f"{self.file} does not exist: no policies here (lightrail learn creates it)")
        return registry


class PolicyWatcher:
    """Swap each newly promoted policy of ``registry`` into ``engine`` (an `Engine`), polling every ``poll_s``."""

    def __init__(self, registry: PolicyRegistry, engine: Any, *, poll_s: float = 1.0) -> None:
        self.registry = registry
        self.engine = engine
        self.poll_s = poll_s
        self.swaps = 0
        self.failed: set[int] = set()
        """Versions whose weights did not load (logged once; the engine keeps serving what it has)."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lightrail-policy-watcher")

    async def check(self) -> bool:
        """Swap in the current policy if it is newer than what the engine serves; True if it swapped."""
        current = self.registry.current()
        if current is None or current.version <= self.engine.policy_version or current.version in self.failed:
            return False
        try:
            model = await asyncio.to_thread(_load_weights, current.path)
        except Exception:
            self.failed.add(current.version)  # tried once: a broken folder is not reloaded every poll
            raise
        await self.engine.update_weights(model, version=current.version)
        self.swaps += 1
        log.warning("serving policy v%d (%s)", current.version, current.path)
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                log.exception("policy swap failed; still serving v%d", self.engine.policy_version)
            await asyncio.sleep(self.poll_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _load_weights(path: str) -> Any:
    from lightrail.engine.engine import _load_causal_lm

    return _load_causal_lm(Path(path), None)


def read_history(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """``metrics.jsonl`` of a policies folder, parsed (missing file: empty)."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]
