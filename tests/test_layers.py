"""The layers point one way: ``protocol`` is the bottom and imports nothing else of the project, and the
client SDK imports nothing of the broker (what both need lives in ``protocol``). Read from the source with
``ast``, so an import inside a function or under ``TYPE_CHECKING`` counts as much as one at the top."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

REPO: Final = Path(__file__).resolve().parents[1]
#: the project's top-level packages: every directory of the repository with an __init__.py
PROJECT_PACKAGES: Final = frozenset(path.parent.name for path in REPO.glob("*/__init__.py"))


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file at ``path``; a relative import is named
    from the file's own package."""
    package = ".".join(path.relative_to(REPO).parent.parts)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield node.lineno, f"{base}.{node.module}" if node.module else base
            else:
                yield node.lineno, node.module or ""


def forbidden_imports(package: str, forbidden: frozenset[str]) -> list[str]:
    """``file:line: module`` for each import in ``package`` of a module under one of ``forbidden``."""
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if module.split(".")[0] in forbidden:
                found.append(f"{path.relative_to(REPO)}:{line}: {module}")
    return found


def test_the_project_packages_are_found() -> None:
    assert {"protocol", "commitlog", "dledger", "broker", "client"} <= PROJECT_PACKAGES


def test_the_client_imports_nothing_of_the_broker() -> None:
    assert forbidden_imports("client", frozenset({"broker"})) == []


def test_protocol_imports_nothing_else_of_the_project() -> None:
    assert forbidden_imports("protocol", PROJECT_PACKAGES - {"protocol"}) == []


def test_importing_the_client_loads_no_broker_module() -> None:
    """What the source says, seen in a process: the SDK's modules pull in no broker module indirectly."""
    probe = ("import sys, client, client.admin, client.instance, client.push_consumer, client.transaction; "
             "print(sorted({name for name in sys.modules if name.split('.')[0] == 'broker'}))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(("source", "expected"), [
    ("from broker.remoting import RequestCode\n", ["broker.remoting"]),
    ("import broker.topics as topics\n", ["broker.topics"]),
    ("def later() -> None:\n    from broker import send\n", ["broker"]),
    ("from . import codec\n", ["pkg"]),
    ("from .codes import ResponseCode\n", ["pkg.codes"]),
])
def test_every_kind_of_import_is_seen(tmp_path: Path, source: str, expected: list[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "pkg").mkdir()
    path = tmp_path / "pkg" / "module.py"
    path.write_text(source)
    assert [module for _, module in imported_modules(path)] == expected
