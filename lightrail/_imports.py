"""Import references, the one way every command and process resolves a user's object from a string: the agent
(``train``, ``dev``, ``runner``, runner processes, Ray actors), a config's functions, a gateway's redactor.

A reference is ``module:object`` (``object`` may be dotted, ``Class.attr``) or ``path/to/file.py:object``. The
working folder is on the import path, as with ``python -m``: ``my_agents:solve`` finds ``./my_agents.py``. A
failure is an `ImportError` whose one-line message names the module or attribute that is missing and where it
looked.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

__all__ = ["FILE_MODULE_PREFIX", "MissingReference", "check_file_reference", "import_object", "split_reference"]

FILE_MODULE_PREFIX = "__lightrail_file__"
"""The private module name a ``file.py:object`` reference is loaded under (its ``__main__`` block does not run)."""


class MissingReference(ImportError):
    """A module or file of a reference is not there (the message says which, and where it looked)."""


def split_reference(ref: str) -> tuple[str, str]:
    """``(module or file, object)`` of a reference, or a `ValueError` saying what a reference looks like."""
    module_name, sep, qualname = ref.rpartition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"{ref!r} must look like 'module:object' or 'path/to/file.py:object'")
    return module_name, qualname


def _is_file(module_name: str) -> bool:
    return module_name.endswith(".py") or os.sep in module_name


def import_object(ref: str) -> Any:
    """The object ``ref`` names (see the module docstring); `ValueError` for a malformed reference,
    `MissingReference` (an `ImportError`) for a module, file or attribute that is missing. Errors raised by the
    user's module itself (its own failing imports included) propagate as they are."""
    module_name, qualname = split_reference(ref)
    try:
        module = _load_file(module_name) if _is_file(module_name) else _import_module(module_name)
    except MissingReference as exc:
        raise MissingReference(f"{ref!r}: {exc}") from None
    where = getattr(module, "__file__", None) or module_name
    obj = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise MissingReference(f"{ref!r}: {module_name} ({where}) has no attribute {qualname!r}") from None
    return obj


def check_file_reference(ref: str) -> None:
    """For a ``file.py:object`` reference, that the file exists (without running it: it may be the script that
    is running us); `ImportError` naming the path otherwise. Module references are not checked here."""
    module_name, _ = split_reference(ref)
    if _is_file(module_name) and not os.path.isfile(module_name):
        raise MissingReference(f"{ref!r}: no file {os.path.abspath(module_name)}")


def _import_module(module_name: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # like `python -m`: the working folder's modules import
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise MissingReference(
                f"no module named {missing!r} in the working folder {cwd} or on the Python path "
                f"({len(sys.path)} entries); run from the folder that holds it, or give path/to/file.py:object"
            ) from None
        raise MissingReference(
            f"importing {module_name} failed: it imports {missing!r}, which is not installed"
        ) from None


def _load_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise MissingReference(f"no file {os.path.abspath(path)}")
    path = os.path.abspath(path)
    name = f"{FILE_MODULE_PREFIX}{abs(hash(path))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise MissingReference(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: pickling and dataclasses look the module up while it loads
    sys.path.insert(0, os.path.dirname(path))  # the script's own imports resolve as when it is run directly
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
