"""Checkpoint plumbing for policy updates: atomic directory writes and random-number-generator state.

A checkpoint is a directory. It is written under a temporary name next to its destination and renamed into place
only when every file in it is complete and flushed, so a crash mid-save leaves either the previous checkpoint or
the new one, never a half-written directory under the real name. (If the destination already exists it is first
renamed aside; a crash between the two renames leaves the old checkpoint at ``<dir>.old-*``: old data is never
deleted before the new data is in place.)
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_directory", "capture_rng_state", "restore_rng_state"]


def _fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    # Directory fsync makes the rename itself durable; not supported everywhere (e.g. Windows), hence best effort.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_directory(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory; on normal exit it replaces ``dest`` atomically, on error it is removed.

    >>> with atomic_directory("ckpt/step-3") as tmp:
    ...     _ = (tmp / "state.json").write_text("{}")
    >>> sorted(p.name for p in Path("ckpt/step-3").iterdir())
    ['state.json']
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if dest.exists():
            old = dest.parent / f"{dest.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(dest, old)
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def capture_rng_state() -> dict[str, Any]:
    """Python's and torch's (CPU and every CUDA device) generator states, in a ``torch.save``-able dict."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what `capture_rng_state` returned. CUDA states are restored only when CUDA is available."""
    random.setstate(_as_python_state(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_python_state(value: Any) -> tuple:
    # random.setstate wants (version, tuple_of_ints, gauss_next); serialisers may hand back lists.
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
