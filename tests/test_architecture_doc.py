"""docs/ARCHITECTURE.md names files and functions at every step of a send and a pull: this keeps those names
true. Code moves (a module split, a class renamed) leave the document pointing at nothing; the test lists
each such reference, so whoever moves the code sees exactly what to rename in the document.

References are read without importing anything (``ast``): ``path/to/file.py`` must exist, and
``path/to/file.py::Name`` or ``path/to/file.py::Class.method`` must name something defined there: a
class, a function, a module-level constant, a method, a class attribute, an attribute a method assigns
on ``self``, or a function nested in the one before it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

REPOSITORY: Final = Path(__file__).resolve().parents[1]
DOCUMENT: Final = REPOSITORY / "docs" / "ARCHITECTURE.md"
#: a repository path to a source file, optionally followed by ``::`` and a dotted name defined in it
REFERENCE: Final = re.compile(
    r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+[A-Za-z_][\w-]*\.(?:py|pyi|c))"
    r"(?:::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?"
)
#: the document names the code at every step of several flows: far fewer means the pattern broke
REFERENCES_MIN: Final = 40

Scope = ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def references(text: str) -> list[tuple[int, str, str | None]]:
    """Every (line number, path, dotted name or None) the text refers to, in order."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in REFERENCE.finditer(line):
            found.append((number, match.group(1), match.group(2)))
    return found


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a body, looking into if/try/with/for blocks (definitions made under a
    condition count) but not into nested functions or classes."""
    for statement in body:
        yield statement
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)
        for handler in getattr(statement, "handlers", ()):
            yield from _statements(handler.body)


def _targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment assigns to (nothing for any other node)."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


def _assigned_names(statement: ast.stmt) -> Iterator[str]:
    for target in _targets(statement):
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                yield node.id


def _self_attributes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[str]:
    for node in ast.walk(function):
        for target in _targets(node):
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self"):
                yield target.attr


def _member(scope: Scope, name: str) -> Scope | bool:
    """What ``name`` is inside ``scope``: a scope to look further into, True for a plain name (a constant,
    an attribute), False when it is not defined there. A name only imported is not defined there: the
    document names the place that defines it."""
    for statement in _statements(scope.body):
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and statement.name == name:
            return statement
        if name in _assigned_names(statement):
            return True
    if isinstance(scope, ast.ClassDef):
        for statement in _statements(scope.body):
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and name in _self_attributes(statement):
                return True
    return False


def problem(path: str, name: str | None, root: Path = REPOSITORY) -> str | None:
    """Why the reference does not hold, or None when it does."""
    file = root / path
    if not file.is_file():
        return f"{path}: no such file"
    if name is None or file.suffix == ".c":
        return None
    scope: Scope | bool = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    walked: list[str] = []
    for part in name.split("."):
        if scope is True:
            return f"{path}::{name}: {'.'.join(walked)} is not a class or function, so it has no {part}"
        assert not isinstance(scope, bool)
        scope = _member(scope, part)
        if scope is False:
            where = ".".join(walked) or "the module"
            return f"{path}::{name}: {part} is not defined in {where}"
        walked.append(part)
    return None


def broken_references(text: str, root: Path = REPOSITORY) -> list[str]:
    """One line per reference of ``text`` that does not hold."""
    return [f"docs/ARCHITECTURE.md line {number}: {reason}"
            for number, path, name in references(text)
            if (reason := problem(path, name, root)) is not None]


def test_every_reference_in_the_architecture_document_names_existing_code() -> None:
    text = DOCUMENT.read_text(encoding="utf-8")
    assert len(references(text)) >= REFERENCES_MIN
    broken = broken_references(text)
    assert not broken, "rename these in docs/ARCHITECTURE.md (the code moved):\n" + "\n".join(broken)


def test_a_reference_to_a_missing_file_name_or_method_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "mod.py").write_text(
        "import os\n"
        "LIMIT = 3\n"
        "if os.name:\n"
        "    def conditional() -> None: ...\n"
        "class Thing:\n"
        "    size: int = 1\n"
        "    def __init__(self) -> None:\n"
        "        self.count = 0\n"
        "    def act(self) -> None:\n"
        "        def step() -> None: ...\n",
        encoding="utf-8",
    )
    (package / "native.c").write_text("int f(void) { return 0; }\n", encoding="utf-8")
    good = ("`pkg/mod.py`, `pkg/mod.py::LIMIT`, `pkg/mod.py::conditional`, `pkg/mod.py::Thing`, "
            "`pkg/mod.py::Thing.act`, `pkg/mod.py::Thing.act.step`, `pkg/mod.py::Thing.size`, "
            "`pkg/mod.py::Thing.count`, `pkg/native.c`")
    assert len(references(good)) == 9
    assert broken_references(good, tmp_path) == []
    bad = ("| 1 | `pkg/gone.py::Thing` |\n"
           "then `pkg/mod.py::Other` and `pkg/mod.py::Thing.missing`,\n"
           "`pkg/mod.py::LIMIT.real` and `pkg/mod.py::os`")
    assert broken_references(bad, tmp_path) == [
        "docs/ARCHITECTURE.md line 1: pkg/gone.py: no such file",
        "docs/ARCHITECTURE.md line 2: pkg/mod.py::Other: Other is not defined in the module",
        "docs/ARCHITECTURE.md line 2: pkg/mod.py::Thing.missing: missing is not defined in Thing",
        "docs/ARCHITECTURE.md line 3: pkg/mod.py::LIMIT.real: LIMIT is not a class or function, so it has no real",
        "docs/ARCHITECTURE.md line 3: pkg/mod.py::os: os is not defined in the module",
    ]
