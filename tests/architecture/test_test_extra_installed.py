"""The venv that runs the suite holds every requirement of pyproject.toml's `test` extra, at a version it allows.

The suite's tests of optional parts skip when their package is absent (`pytest.importorskip`), so a venv built from
an older pyproject.toml would pass with whole features untested: CI once ran the default suite in a venv without
the `test` extra's openai, and every gateway test skipped or failed to import. Read from pyproject.toml itself, not
from rlvr's installed metadata (a stale install's metadata is stale too)."""

from __future__ import annotations

import tomllib
from importlib import metadata

from helpers import REPO
from packaging.requirements import Requirement


def _test_extra() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["optional-dependencies"]["test"]]


def test_the_test_extra_is_read_and_names_the_gateway_packages():
    names = {r.name for r in _test_extra()}
    assert {"pytest", "openai", "fastapi", "uvicorn", "httpx"} <= names


def test_every_requirement_of_the_test_extra_is_installed_at_an_allowed_version():
    problems = []
    for req in _test_extra():
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req} is not installed")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req} is installed at {version}")
    assert not problems, ("this venv does not hold pyproject.toml's `test` extra: " + "; ".join(problems)
                          + ". Reinstall it: pip install -e '.[test]' (or `make clean-venv test`)")
