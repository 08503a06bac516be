"""The broker, the name server, the client and the CLI need only the core dependencies: neither pyspark,
pyarrow nor matplotlib (the [spark] and [chaos] extras).

The fresh-venv test builds a virtual environment holding exactly the distributions pyproject.toml's core
``dependencies`` pull in (their installed files linked from this venv: offline and fast, no download), puts
the repository on its path as an editable install would, and runs a real group with it. Commands that need
an extra say which one.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path
from typing import Final

import pytest
from packaging.requirements import Requirement

REPO: Final = Path(__file__).resolve().parents[2]
EXTRA_ONLY: Final = ("pyspark", "pyarrow", "matplotlib", "toxiproxy", "mfusepy")
IMPORTS: Final = "import broker.node, broker.namesrv.server, client, cli.main"


def project() -> dict[str, object]:
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert isinstance(table, dict)
    return table


def core_requirements() -> list[Requirement]:
    dependencies = project()["dependencies"]
    assert isinstance(dependencies, list)
    return [Requirement(text) for text in dependencies]


def test_the_heavy_packages_are_extras_not_core_dependencies() -> None:
    core = {requirement.name for requirement in core_requirements()}
    assert not core & {"pyspark", "pyarrow", "matplotlib", "toxiproxy-python", "mfusepy"}
    extras = project()["optional-dependencies"]
    assert isinstance(extras, dict)
    spark = {Requirement(text).name for text in extras["spark"]}
    chaos = {Requirement(text).name for text in extras["chaos"]}
    assert {"pyspark", "pyarrow"} <= spark and {"toxiproxy-python", "matplotlib", "raftmq"} <= chaos
    install_line = next(line for line in (REPO / "Makefile").read_text().splitlines() if "pip install" in line)
    assert "'.[dev,spark,chaos]'" in install_line  # make test / make demo still install everything


def test_importing_the_broker_client_and_cli_loads_no_spark_or_matplotlib() -> None:
    probe = f"import sys; {IMPORTS}; print(sorted({{m.split('.')[0] for m in sys.modules}}))"
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", probe], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = set(result.stdout.strip().strip("[]").replace("'", "").split(", "))
    assert not loaded & {"pyspark", "pyarrow", "matplotlib", "py4j", "pandas"}
    timed = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert "broker.node" in timed and not any(name.split(".")[0] in ("pyspark", "matplotlib") for name in timed)


def _closure(requirements: list[Requirement]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``requirements`` need, transitively (markers evaluated, no extras)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = list(requirements)
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        distribution = importlib.metadata.distribution(requirement.name)
        name = distribution.metadata["Name"].lower()
        if name in found:
            continue
        found[name] = distribution
        pending += [Requirement(text) for text in distribution.requires or []]
    return list(found.values())


def _core_only_venv(directory: Path) -> Path:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(directory)
    python = directory / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    for distribution in _closure(core_requirements()):
        installed = Path(str(distribution.locate_file("")))
        tops = {Path(str(path)).parts[0] for path in distribution.files or [] if not str(path).startswith("..")}
        for top in tops:
            target = site / top
            if (installed / top).exists() and not target.exists():
                target.symlink_to(installed / top)
    (site / "raftmq-repository.pth").write_text(f"{REPO}\n")  # as `pip install -e .` would put it on the path
    return python


@pytest.mark.slow
def test_a_core_only_install_runs_a_group_and_names_the_extras_it_lacks(tmp_path: Path) -> None:
    python = _core_only_venv(tmp_path / "venv")
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*arguments: str, timeout_seconds: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), *arguments], capture_output=True, text=True, cwd=tmp_path,
                              env=environment, timeout=timeout_seconds)

    probe = run("-c", f"import importlib.util, sys; {IMPORTS}; "
                      f"print([m for m in {EXTRA_ONLY!r} if importlib.util.find_spec(m) or m in sys.modules])")
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip() == "[]"  # none of them is even installed here
    for arguments, extra in ((["chaos", "scenarios"], "chaos"), (["verify", "--data-dir", str(tmp_path)], "spark")):
        result = run("-m", "cli.main", *arguments)
        assert result.returncode == 1 and f"pip install 'raftmq[{extra}]'" in result.stderr, result.stderr[-3000:]
        assert "Traceback" not in result.stderr

    data = tmp_path / "cluster"
    up = run("-m", "cli.main", "cluster", "up", "--data-dir", str(data), "--set", f"store.segment_size_bytes={8 << 20}")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        namesrv = next(line for line in up.stdout.splitlines() if line.startswith("namesrv=")).split("=", 1)[1]
        sent = run("-m", "cli.main", "send", "Light", "core only", "--namesrv", namesrv)
        assert sent.returncode == 0 and "SEND_OK" in sent.stdout, sent.stderr[-3000:]
        consumed = run("-m", "cli.main", "consume", "Light", "--group", "light", "--from", "first", "--count", "1",
                       "--namesrv", namesrv)
        assert consumed.returncode == 0 and "core only" in consumed.stdout, consumed.stderr[-3000:]
    finally:
        run("-m", "cli.main", "cluster", "down", "--data-dir", str(data))
