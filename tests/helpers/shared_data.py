"""The development data (GSM8K, MATH-500, the prompt files) lives in ../shared next to the checkout; a user's clone
never has it. Every test that reads it finds it through these helpers and skips cleanly without it
(tests/architecture/test_shared_data_helper.py checks that no test looks elsewhere). RLVR_SHARED_DIR=DIR stands for
../shared; `make test-noshared` runs the default suite from a copy of the tree whose ../shared does not exist, as a
fresh clone would (.ci/run does)."""

import os
from pathlib import Path

import pytest

from helpers import REPO

SHARED_DIR = Path(os.environ.get("RLVR_SHARED_DIR") or REPO.parent / "shared")
SHARED_REASON = "development data in ../shared (absent from a clone; RLVR_SHARED_DIR points elsewhere)"


def shared_path(*parts: str) -> Path:
    """A path under ../shared (or RLVR_SHARED_DIR); it may not exist."""
    return SHARED_DIR.joinpath(*parts)


def needs_shared(*parts: str) -> pytest.MarkDecorator:
    """Skip mark for a test (or, as `pytestmark`, a module) that reads shared_path(*parts)."""
    path = shared_path(*parts)
    return pytest.mark.skipif(not path.exists(), reason=f"needs {path}: {SHARED_REASON}")


def require_shared(*parts: str) -> Path:
    """shared_path(*parts), or skip the running test when it does not exist."""
    path = shared_path(*parts)
    if not path.exists():
        pytest.skip(f"needs {path}: {SHARED_REASON}")
    return path
