"""One lazy face for every package: its public names load on first use, so ``import lightrail`` (and a runner that
imports only the store client) never pays for torch, transformers or OpenTelemetry.

A package writes its export list once, as the ``from MODULE import NAME`` statements of its ``if TYPE_CHECKING:``
block (what type checkers and IDEs read), and hands its module to `lazy_face`, which reads that block (with `ast`,
nothing imported) into the name -> module map behind ``__getattr__``, ``__dir__`` and ``__all__``::

    from typing import TYPE_CHECKING

    from lightrail._lazy import lazy_face

    if TYPE_CHECKING:
        from lightrail.engine.engine import Engine

    _EXPORTS, __all__, __getattr__, __dir__ = lazy_face(__name__, __file__)

(TRL keeps one such helper, ``trl/import_utils.py``'s ``_LazyModule``, but writes each export twice: its
``_import_structure`` and its ``TYPE_CHECKING`` imports; here the second is the only one.)
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def exports_of(init_file: str) -> dict[str, tuple[str, str]]:
    """Public name -> (defining module, its name there), read from the ``if TYPE_CHECKING:`` block(s) of a package's
    ``__init__.py``. Only absolute ``from MODULE import NAME [as ALIAS]`` statements count."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), init_file)
    exports: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    for alias in stmt.names:
                        exports[alias.asname or alias.name] = (stmt.module, alias.name)
    return exports


def lazy_face(
    package: str,
    init_file: str,
    *,
    computed: Mapping[str, Callable[[], Any]] | None = None,
    deprecated: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(_EXPORTS, __all__, __getattr__, __dir__)`` of the package ``package`` whose ``__init__.py`` is
    ``init_file``.

    ``_EXPORTS`` maps each public name to its defining module; ``__all__`` is those names sorted, plus any
    ``computed`` ones (name -> a function giving the value on first use, e.g. ``__version__``) and any the package
    defines eagerly (set ``__all__`` itself then). ``deprecated`` maps an old name still served, not listed, to the
    module that now exports it: each use warns (`DeprecationWarning`) and names that module. An unknown name raises
    `AttributeError` naming the package, as a plain module does."""
    table = exports_of(init_file)
    exports = {name: module for name, (module, _) in table.items()}
    computed = dict(computed or {})
    deprecated = dict(deprecated or {})
    names = sorted({*exports, *computed})

    def __getattr__(name: str) -> Any:
        if name in table:
            module, attribute = table[name]
            value = getattr(importlib.import_module(module), attribute)
        elif name in computed:
            value = computed[name]()
        elif name in deprecated:
            warnings.warn(
                f"{package}.{name} moved: import it from {deprecated[name]}", DeprecationWarning, stacklevel=2
            )
            return getattr(importlib.import_module(deprecated[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*names, *getattr(sys.modules[package], "__all__", ())})

    return exports, names, __getattr__, __dir__
