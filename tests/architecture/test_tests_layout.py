"""The tests are laid out like the package (issue 39, item 5): the test of rlvr/X/y.py is under tests/X/, a folder
that mirrors no package part says what its tests are about (tests/cli/: the `rlvr` command in a subprocess,
tests/learning/: a model learns, tests/architecture/: the code's shape), and nothing is directly in tests/ but
conftest.py. Code shared by test files lives in tests/helpers/ (imported as `helpers`), so no file imports a test
file: read from the source (every import statement, and the Python scripts held in string constants that a test
runs in a fresh process)."""

from __future__ import annotations

import ast
import re
from collections import Counter

from helpers import REPO, TESTS

# folders of tests/ that mirror no part of rlvr/ or of the repository, and what they hold
TOPICAL = {"architecture": "the code's shape, read from the source", "learning": "a model learns",
           "helpers": "the code test files share", "fixtures": "vendored data the tests read"}
SCRIPT_IMPORT = re.compile(r"^\s*(?:from\s+(test_\w*|conftest)\b|import\s+(test_\w*|conftest)\b)", re.M)


def _test_files():
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def _imported_test_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # a script run in a subprocess
            names = [m.group(1) or m.group(2) for m in SCRIPT_IMPORT.finditer(node.value)]
        found += [(node.lineno, n) for n in names if n.split(".")[0].startswith("test_") or n == "conftest"]
    return found


def test_no_file_under_tests_imports_a_test_file_or_conftest():
    bad = [f"{p.relative_to(TESTS)}:{line}: imports {name}" for p in sorted(TESTS.rglob("*.py"))
           if "__pycache__" not in p.parts
           for line, name in _imported_test_modules(ast.parse(p.read_text(encoding="utf-8")))]
    assert not bad, "put what test files share in tests/helpers/ (import helpers.X):\n" + "\n".join(bad)


def test_nothing_but_conftest_sits_directly_in_tests():
    assert sorted(p.name for p in TESTS.glob("*.py")) == ["conftest.py"]
    assert not list(TESTS.glob("test_*")), "every test file sits in the folder of what it tests"


def test_every_test_folder_mirrors_the_package_or_says_what_it_holds():
    bad = []
    for folder in sorted({p.parent for p in _test_files()}):
        rel = folder.relative_to(TESTS)
        top = rel.parts[0]
        if top in TOPICAL:
            continue
        mirrors = (REPO / "rlvr" / rel).is_dir() or (REPO / "rlvr" / rel).with_suffix(".py").is_file()
        if not mirrors and not (len(rel.parts) == 1 and (REPO / top).is_dir()):  # benchmarks/, scripts/, docs/
            bad.append(str(rel))
    assert not bad, f"tests/<folder> mirrors rlvr/<folder> (or a folder of the repository): {bad}"
    assert not {p.parent.relative_to(TESTS).parts[0] for p in _test_files()} & {"helpers", "fixtures"}


def test_test_file_names_are_unique_and_no_folder_is_a_package():
    """pytest imports each test file by its base name (rootdir-based `prepend` mode: the file's folder goes on
    sys.path), so two test_x.py in two folders would clash; an __init__.py would change how they are named."""
    counts = Counter(p.name for p in _test_files())
    assert not [n for n, k in counts.items() if k > 1], [n for n, k in counts.items() if k > 1]
    inits = [str(p.relative_to(TESTS)) for p in TESTS.rglob("__init__.py") if p.parent != TESTS / "helpers"]
    assert not inits, inits


def test_the_check_sees_an_import_of_a_test_file():
    # (written in pieces, so that this file's own string constants hold no import of a test file)
    source = "\n".join(" ".join(words) for words in [
        ("from", "test_a", "import x"), ("import", "test_b.c"), ("from", "helpers.cli", "import run_rlvr"),
        ('S = """',), ("from", "conftest", "import y"), ('"""',)])
    assert [n for _, n in _imported_test_modules(ast.parse(source))] == ["test_a", "test_b.c", "conftest"]
