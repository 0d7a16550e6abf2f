"""Every ``>>>`` example in lightrail's docstrings runs as written, so a user who copies one gets what it shows.

The examples run with doctest, each module's in a fresh temporary folder, with top-level ``await`` allowed as in
``python -m asyncio`` (one event loop per docstring). An example that needs what a test cannot have (a GPU,
a training run, a database on another host) is marked ``# doctest: +SKIP``; it is still compiled, and every call in
it to a name it imports or its module defines must bind to that callable's signature, so a renamed or misspelled
parameter (``tool_rewards=`` for ``tool_rewards_rule=``) fails here.
"""

from __future__ import annotations
import __future__

import ast
import asyncio
import doctest
import importlib
import importlib.util
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import pytest

import lightrail

_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def modules_holding(marker: str) -> list[str]:
    """The lightrail modules whose source holds ``marker`` (found without importing them)."""
    names = []
    for info in pkgutil.walk_packages(lightrail.__path__, "lightrail."):
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and spec.origin.endswith(".py") and marker in Path(spec.origin).read_text():
            names.append(info.name)
    return names


MODULES = modules_holding(">>> ")
MODULES_WITH_LITERALS = sorted({*MODULES, *modules_holding("::\n")})


def import_or_skip(name: str) -> ModuleType:
    """The module, or a skip when an optional dependency of it (torch, vllm, asyncpg, ...) is not installed."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("lightrail"):
            pytest.skip(f"{name} needs {exc.name}")
        raise


def doctests(module: ModuleType) -> list[doctest.DocTest]:
    return [t for t in doctest.DocTestFinder().find(module, module.__name__) if t.examples]


def skipped(example: doctest.Example) -> bool:
    return bool(example.options.get(doctest.SKIP))


def test_examples_are_found():
    # the walk sees the modules (a broken walk would make every test below pass vacuously)
    assert {"lightrail.adapters.rewards", "lightrail.store.sqlite", "lightrail.engine.engine"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    module = import_or_skip(name)
    monkeypatch.chdir(tmp_path)
    loop = asyncio.new_event_loop()

    def run(code: CodeType, globs: dict[str, Any]) -> None:
        """doctest's ``exec``, made to run a top-level ``await`` on the docstring's loop."""
        if code.co_flags & inspect.CO_COROUTINE:
            loop.run_until_complete(eval(code, globs))  # noqa: S307 - the docstring's own example
        else:
            exec(code, globs)  # noqa: S102

    monkeypatch.setattr(doctest, "exec", run, raising=False)  # doctest's runner looks `exec` up in its globals
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    try:
        for test in doctests(module):
            flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            for feature in __future__.all_feature_names:
                if test.globs.get(feature) is getattr(__future__, feature):
                    flags |= getattr(__future__, feature).compiler_flag
            runner.run(test, compileflags=flags)
    finally:
        loop.close()
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples in {name} failed (output above)"


def unbound_calls(examples: list[doctest.Example], globs: dict[str, Any]) -> list[str]:
    """Calls in ``examples`` whose keywords or number of arguments do not fit the signature of what they call.

    Known names: ``globs`` (the module's), the examples' own imports, and names they assign from a class call
    (``upd = PolicyUpdater(...)``), whose later method calls (``upd.step(rows)``) are checked on the class.
    """
    known: dict[str, Any] = dict(globs)
    instances: dict[str, type] = {}
    problems = []
    for example in examples:
        tree = ast.parse(example.source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = importlib.import_module(node.module)
                known.update({a.asname or a.name: getattr(imported, a.name) for a in node.names})
        for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
            target, leading = None, []
            if isinstance(call.func, ast.Name) and callable(known.get(call.func.id, public(call.func.id, globs))):
                target = known.get(call.func.id, public(call.func.id, globs))
            elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
                owner = call.func.value.id
                cls = instances.get(owner) or (known.get(owner) if inspect.isclass(known.get(owner)) else None)
                if cls is not None:
                    if not hasattr(cls, call.func.attr):
                        problems.append(f"{ast.unparse(call)}: {cls.__name__} has no attribute {call.func.attr!r}")
                        continue
                    target = getattr(cls, call.func.attr)
                    if owner in instances and inspect.isfunction(inspect.getattr_static(cls, call.func.attr)):
                        leading = [None]  # self
            if target is None:
                continue
            try:
                signature = inspect.signature(target)
            except (TypeError, ValueError):  # a builtin without a signature
                continue
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                continue  # *args / **kwargs: the count is unknown
            try:
                signature.bind(*leading, *call.args, **{k.arg: k.value for k in call.keywords if k.arg})
            except TypeError as exc:
                problems.append(f"{ast.unparse(call)}: {exc}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                cls = known.get(func.id, public(func.id, globs)) if isinstance(func, ast.Name) else None
                if inspect.isclass(cls):
                    instances.update({t.id: cls for t in node.targets if isinstance(t, ast.Name)})
    return problems


def public(name: str, globs: dict[str, Any]) -> Any:
    """What ``name`` is in the public surface nearest the example's module: its package's ``__all__``, then the
    parent packages' up to ``lightrail`` (an example may use a name its own module does not import)."""
    parts = str(globs.get("__name__", "lightrail")).split(".")
    for depth in range(len(parts), 0, -1):
        package = importlib.import_module(".".join(parts[:depth]))
        if name in getattr(package, "__all__", ()):
            return getattr(package, name)
    return None


_LITERAL = re.compile(r"::\n\n((?:[ \t]+\S.*\n|[ \t]*\n)+)")


def literal_blocks(docstring: str) -> list[doctest.Example]:
    """The ``Example::`` literal blocks of a docstring that are Python, as examples (shell or YAML blocks are not)."""
    blocks = []
    for match in _LITERAL.finditer(docstring + "\n"):
        source = textwrap.dedent(match.group(1)).strip() + "\n"
        try:
            ast.parse(source)
        except SyntaxError:
            continue
        blocks.append(doctest.Example(source, ""))
    return blocks


def unrun_examples(module: ModuleType) -> list[tuple[str, list[doctest.Example], dict[str, Any]]]:
    """Per docstring of ``module``: its examples that no test runs (``+SKIP`` ones and literal blocks)."""
    found = []
    for test in doctest.DocTestFinder(exclude_empty=False).find(module, module.__name__):
        examples = [*test.examples, *literal_blocks(test.docstring or "")]
        if any(skipped(e) for e in examples) or len(examples) > len(test.examples):
            found.append((test.name, examples, test.globs))
    return found


@pytest.mark.parametrize("name", MODULES_WITH_LITERALS)
def test_examples_not_run_call_what_exists(name):
    module = import_or_skip(name)
    for docstring, examples, globs in unrun_examples(module):
        for example in examples:
            compile(example.source, docstring, "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        assert not unbound_calls(examples, globs), docstring


def test_a_misspelled_parameter_in_an_example_not_run_is_found():
    from lightrail.adapters import rewards

    examples = literal_blocks(
        "Example::\n\n    rule = ToolRewardRule(success=0.1)\n    episode = build_episode(spans, tool_rewards=rule)\n"
    ) + doctest.DocTestParser().get_examples(
        ">>> from lightrail.store.sqlite import SQLiteStore\n"
        ">>> store = SQLiteStore('x.db', synchronus='FULL')   # doctest: +SKIP\n"
        ">>> store.enqeue([])   # doctest: +SKIP\n"
    )
    problems = unbound_calls(examples, vars(rewards))  # build_episode: from lightrail.adapters' public names
    assert len(problems) == 3, problems
    assert "tool_rewards" in problems[0] and "synchronus" in problems[1] and "enqeue" in problems[2], problems
