"""Imports inside rlvr/ run one way (docs/design.md, "Layers"): no cycle between modules and no module
importing a layer above its own. The graph is read from the source (module-level imports and those inside
functions alike: a lazy import is still a dependency), so a cycle or a reach-up cannot come back unseen."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

ROOT = REPO / "rlvr"

# Lowest first. A module may import its own layer or a lower one (docs/design.md's table says what each holds).
LAYERS: dict[str, int] = {
    "algo": 0, "rewards": 0, "config": 0, "runtime": 0,
    "models": 1, "data": 1,
    "eval": 2, "rollout": 2, "runs": 2,
    "envs": 3, "distributed": 3, "gateway": 3,
    "train": 4,
    "commands": 5, "cli": 5, "compat": 5, "__main__": 5,
}


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(mod: str, node: ast.AST, is_pkg: bool, modules: dict[str, Path]) -> list[str]:
    """The rlvr modules an import statement names (a name imported from a package counts as its
    submodule when there is one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        if node.level:
            base = base[: len(base) - (node.level - 1)]
            pkg = ".".join(base + ([node.module] if node.module else []))
        else:
            pkg = node.module or ""
        names = [f"{pkg}.{a.name}" if f"{pkg}.{a.name}" in modules else pkg for a in node.names]
    out = []
    for name in names:
        if name != "rlvr" and not name.startswith("rlvr."):
            continue
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        out.append(name)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the rlvr modules it imports anywhere in its source, except under `if TYPE_CHECKING:`
    (annotations only) and a package's imports of its own submodules (re-exports)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST, mod=mod, is_pkg=is_pkg) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    graph[mod].update(t for t in _targets(mod, child, is_pkg, modules)
                                      if t != mod and not t.startswith(mod + "."))
                visit(child)

        visit(ast.parse(path.read_text(encoding="utf-8")))
    return graph


def layer_of(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else ""


# Within rlvr/train/, three rooms over the configs (docs/design.md, "Layers"): the run kit under every stage, the
# RL learner (rlvr/train/pg/) on the kit, the stages on top. The configs and the torch-free arithmetic they check
# against (batch sizes, learning-rate schedules) are the floor. A module may import its own floor or a lower one.
TRAIN_FLOORS: dict[str, int] = {
    "config": 0, "batching": 0, "schedules": 0,
    "precision": 1, "optimizer": 1, "policy": 1, "tasks": 1, "judge": 1, "run_settings": 1, "session": 1,
    "pg": 2,
    "sft": 3, "ei": 3, "distill": 3, "evaluation": 3, "filtering": 3, "pipeline": 3, "demo": 3,
}


def train_room(mod: str) -> str:
    """The room of a module under rlvr.train ("" for rlvr.train itself, its API table, and anything else)."""
    parts = mod.split(".")
    return parts[2] if parts[:2] == ["rlvr", "train"] and len(parts) > 2 else ""


def train_reach_ups(graph: dict[str, set[str]]) -> list[str]:
    return reach_ups(graph, train_room, TRAIN_FLOORS)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def reach_ups(graph: dict[str, set[str]], layer=layer_of, floors: dict[str, int] = LAYERS) -> list[str]:
    """Imports of a module on a higher floor than the importer's (`layer` names a module's floor; "" = none)."""
    out = []
    for mod, targets in sorted(graph.items()):
        a = layer(mod)
        for t in sorted(targets):
            b = layer(t)
            if a and b and floors[b] > floors[a]:
                out.append(f"{mod} ({a}) imports {t} ({b})")
    return out


def test_every_package_has_a_layer():
    unknown = {layer_of(m) for m in _modules(ROOT)} - set(LAYERS) - {""}
    assert not unknown, f"add these packages to LAYERS (and docs/design.md's table): {sorted(unknown)}"


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_layer_imports_a_layer_above_it():
    assert reach_ups(import_graph()) == []


def test_every_train_module_has_a_room():
    rooms = {train_room(m) for m in _modules(ROOT)} - {""}
    assert rooms <= set(TRAIN_FLOORS), f"add these to TRAIN_FLOORS (and docs/design.md): {sorted(rooms - set(TRAIN_FLOORS))}"


def test_within_train_the_kit_is_under_the_learner_and_the_stages():
    assert train_reach_ups(import_graph()) == []


@pytest.fixture
def fake_tree(tmp_path):
    def make(files: dict[str, str]) -> Path:
        root = tmp_path / "rlvr"
        for rel, text in {"__init__.py": "", **files}.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        return root

    return make


def test_the_checks_see_a_lazy_cycle_and_a_lazy_reach_up(fake_tree):
    # the checks themselves can fail: a cycle through an import inside a function, and an upward import
    root = fake_tree({
        "train/__init__.py": "",
        "train/a.py": "from rlvr.train.b import f\n",
        "train/b.py": "def f():\n    from rlvr.train import a\n",
        "algo/__init__.py": "",
        "algo/m.py": "def g():\n    from rlvr.train.a import f\n",
        "data/__init__.py": "from rlvr.data.x import y\n",
        "data/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlvr.train.a import f\ny = 1\n",
    })
    graph = import_graph(root)
    assert cycles(graph) == [["rlvr.train.a", "rlvr.train.b"]]
    assert reach_ups(graph) == ["rlvr.algo.m (algo) imports rlvr.train.a (train)"]



def test_the_room_check_sees_the_kit_reaching_up_to_the_learner(fake_tree):
    root = fake_tree({
        "train/__init__.py": "",
        "train/pg/__init__.py": "",
        "train/pg/loop.py": "from rlvr.train.session import say\n",
        "train/session.py": "def f():\n    from rlvr.train.pg.loop import x\n",
        "train/sft.py": "from rlvr.train.pg import loop\n",
    })
    assert train_reach_ups(import_graph(root)) == ["rlvr.train.session (session) imports rlvr.train.pg.loop (pg)"]


def test_the_command_line_and_the_configs_import_no_torch():
    # `rlvr --help` and config errors answer at once: the CLI, the config sections, data and rewards import
    # no torch (rlvr/commands/* import the trainers inside their functions; docs/design.md, "Layers")
    code = ("import sys, rlvr.cli, rlvr.config, rlvr.train.config, rlvr.data, rlvr.rewards; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent).stdout.strip()
    assert out == "[]"


def private_imports(root: Path = ROOT) -> list[str]:
    """Every import inside rlvr/ that names a leading-underscore module or name of another rlvr module
    (issue 39: one address per name, a private name stays in its module; dunders such as __version__ are
    public)."""
    def private(name: str) -> bool:
        return any(p.startswith("_") and not p.startswith("__") for p in name.split("."))

    out = []
    for mod, path in sorted(_modules(root).items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out += [f"{mod}: import {a.name}" for a in node.names if a.name.startswith("rlvr") and private(a.name)]
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("rlvr")):
                source = "." * node.level + (node.module or "")
                out += [f"{mod}: from {source} import {a.name}" for a in node.names
                        if private(source) or private(a.name)]
    return out


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []


def test_the_private_import_check_sees_names_and_modules(fake_tree):
    root = fake_tree({
        "models/__init__.py": "",
        "models/a.py": "def _helper():\n    pass\n__version__ = '1'\n",
        "models/_inner.py": "x = 1\n",
        "models/b.py": ("from rlvr.models.a import _helper, __version__\nimport rlvr.models._inner\n"
                        "def f():\n    from ._inner import x\n"),
    })
    assert private_imports(root) == ["rlvr.models.b: from rlvr.models.a import _helper",
                                     "rlvr.models.b: import rlvr.models._inner",
                                     "rlvr.models.b: from ._inner import x"]
