"""No arrow runs up (issues 18 and 37): the import graph of pipeline/, steps/, local/ and bench/, read with ``ast``.

Refused, each naming file and line:
(a) an arrow up the house, whose folders lie in layers, lowest first: steps/ (what a step's container runs),
    pipeline/ (the definition and the AWS commands), local/ (the stand-in), bench/ (the measurements); a folder
    imports only those below it, so the product (pipeline/, steps/) imports nothing from local/ or bench/;
(b) an import cycle between the children of any folder: its modules and its sub-packages, a sub-package
    counting as one node (every arrow into or out of it, from any module inside it), and the folder's own
    ``__init__`` one more. A folder without a cycle among its children has layers (the order its arrows
    define), and no arrow runs up them; a cycle between modules shows as one in the folder that holds them;
(c) an import from steps/dapo/ (the RL loop) into steps/gsm8k/ (one task).

Every ``import``/``from ... import`` statement counts: module level, inside functions, under
``if TYPE_CHECKING:``. ``import a.b`` is an arrow to module a.b; ``from a.b import c`` to a.b.c when
that is a module of the tree, else to a.b; relative imports are resolved against the file's package.
An arrow points at the module named, not at the packages around it, whose ``__init__`` Python also runs
(counting those would make every package that re-exports its submodules a cycle with them).
"""
from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("pipeline", "steps", "local", "bench")
HOUSE = ("steps", "pipeline", "local", "bench")  # the house's layers, lowest first


@dataclass(frozen=True)
class Arrow:
    source: str  # module that imports
    target: str  # module of the tree it imports
    file: str  # source file, relative to the root
    line: int
    names: tuple[str, ...] = ()  # what `from target import ...` takes from it

    def __str__(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.file}:{self.line}: {self.source} imports {self.target}{names}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, folders: tuple[str, ...] = FOLDERS) -> dict[str, Path]:
    """Module name -> file, for every .py under the folders."""
    return {module_name(p, root): p for folder in folders for p in sorted((root / folder).rglob("*.py"))}


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from`` import names, its dots resolved against the importing module's package."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def arrows(root: Path, folders: tuple[str, ...] = FOLDERS) -> list[Arrow]:
    """Every import, at any depth of any file, that names a module of the tree."""
    found = modules(root, folders)
    out = []
    for module, path in found.items():
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            targets: dict[str, list[str]] = {}  # module -> the names taken from it
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.setdefault(_nearest(alias.name, found), [])
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, path.name == "__init__.py")
                for alias in node.names:
                    if f"{base}.{alias.name}" in found:  # `from package import module`
                        targets.setdefault(f"{base}.{alias.name}", [])
                    else:
                        targets.setdefault(_nearest(base, found), []).append(alias.name)
            for target, names in targets.items():
                if target and target != module:
                    out.append(Arrow(module, target, rel, node.lineno, tuple(names)))
    return out


def _nearest(name: str, found: dict[str, Path]) -> str:
    """The module of the tree ``name`` is or lies in ("" for none): `import a.b.c` where a.b.c is a name in a.b."""
    while name and name not in found:
        name = name.rpartition(".")[0]
    return name


def cycles(found: list[Arrow]) -> list[tuple[list[str], list[Arrow]]]:
    """Each strongly connected group of modules (Tarjan) with its shortest cycle, as the arrows that close it."""
    graph: dict[str, dict[str, Arrow]] = {}
    for arrow in found:
        graph.setdefault(arrow.source, {}).setdefault(arrow.target, arrow)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(group, _cycle_in(group, graph)) for group in groups]


def _cycle_in(group: list[str], graph: dict[str, dict[str, Arrow]]) -> list[Arrow]:
    """The shortest cycle through the group's first module (breadth first, inside the group)."""
    start, members = group[0], set(group)
    paths: dict[str, list[Arrow]] = {start: []}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt, arrow in sorted(graph.get(node, {}).items()):
            if nxt == start:
                return paths[node] + [arrow]
            if nxt in members and nxt not in paths:
                paths[nxt] = paths[node] + [arrow]
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start} in {group}")  # a strongly connected group always has one


def folder_arrows(found: list[Arrow], folder: str) -> list[Arrow]:
    """The arrows between ``folder``'s children, each end the child it lies in (file and line kept)."""
    out = []
    for arrow in found:
        source, target = _child(folder, arrow.source), _child(folder, arrow.target)
        if source and target and source != target:
            out.append(dataclasses.replace(arrow, source=source, target=target))
    return out


def _child(folder: str, module: str) -> str:
    """The node of ``folder``'s graph that ``module`` is: the folder's own ``__init__`` (named as the folder),
    the module or sub-package directly in it; "" outside it."""
    if module == folder:
        return folder
    if not module.startswith(folder + "."):
        return ""
    return f"{folder}.{module[len(folder) + 1:].split('.')[0]}"


def problems(root: Path, folders: tuple[str, ...] = FOLDERS) -> list[str]:
    """Every violation of (a), (b), (c), one line each, naming file and line."""
    found = arrows(root, folders)
    layer = {name: i for i, name in enumerate(HOUSE)}
    out = [f"{a} (an arrow up the house: {' < '.join(f'{f}/' for f in HOUSE)}, each importing only those below it)"
           for a in found if layer[a.target.split(".")[0]] > layer[a.source.split(".")[0]]]
    out += [f"{a} (steps/dapo/ imports nothing from steps/gsm8k/: the loop takes a task)"
            for a in found if _under(a.source, "steps.dapo") and _under(a.target, "steps.gsm8k")]
    packages = sorted(name for name, path in modules(root, folders).items() if path.name == "__init__.py")
    for folder in packages:
        inside = folder_arrows(found, folder)
        out += [f"import cycle in {folder.replace('.', '/')}/: {line}" for line in _cycle_lines(inside)]
    return out


def _cycle_lines(found: list[Arrow]) -> list[str]:
    out = []
    for group, cycle in cycles(found):
        names = " -> ".join([cycle[0].source] + [a.target for a in cycle])
        line = f"{names}: " + "; ".join(f"{a.file}:{a.line}" for a in cycle)
        if len(group) > len(cycle):  # more circles through the same nodes: every arrow that closes one
            inside = [a for a in found if a.source in group and a.target in group and a not in cycle]
            line += f"; also among {', '.join(group)}: " + "; ".join(
                f"{a.file}:{a.line} {a.source} imports {a.target}" for a in inside)
        out.append(line)
    return out


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# --- the tree ------------------------------------------------------------------------------------------------


def test_no_arrow_runs_up() -> None:
    found = problems(ROOT)
    assert found == [], "import rules broken:\n  " + "\n  ".join(found)


# --- the checker itself, on a tree made for it ------------------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


CLEAN = {
    "pipeline/__init__.py": "",
    "pipeline/costs.py": "import json\n",
    "pipeline/start.py": "from pipeline.costs import json\nfrom steps.dapo import loop\n",
    "steps/__init__.py": "",
    "steps/dapo/__init__.py": "",
    "steps/dapo/loop.py": "from . import task\n",
    "steps/dapo/task.py": "from typing import Protocol\n",
    "steps/gsm8k/__init__.py": "from steps.dapo.task import Protocol\n",
    "local/__init__.py": "",
    "local/stand_in.py": "from pipeline import costs\nimport steps.gsm8k\n",
    "bench/__init__.py": "",
    "bench/loops.py": "from local.stand_in import costs\n",
}


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = write(tmp_path, CLEAN)
    assert problems(root) == []
    # The arrows it follows: relative, from-package-import-module, plain import.
    assert {(a.source, a.target) for a in arrows(root)} >= {
        ("steps.dapo.loop", "steps.dapo.task"), ("bench.loops", "local.stand_in"),
        ("local.stand_in", "pipeline.costs"), ("local.stand_in", "steps.gsm8k"),
        ("pipeline.start", "steps.dapo.loop")}


UP = "(an arrow up the house: steps/ < pipeline/ < local/ < bench/, each importing only those below it)"


def test_each_violation_is_named_with_file_and_line(tmp_path: Path) -> None:
    root = write(tmp_path, {
        **CLEAN,
        # (a) at module level, in a function, and under TYPE_CHECKING
        "pipeline/budget.py": "from local.stand_in import costs\n",
        "steps/train.py": "def run():\n    import bench.loops\n",
        "steps/evaluate.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from local import stand_in\n"),
        # (b) a circle of three, one arrow of it inside a function
        "local/faults.py": "from local.models import Session\n",
        "local/models.py": "from local.responses import wire\n",
        "local/responses.py": "def wire():\n    from local import faults\n",
        # (c) relative, so only resolving the dots finds it
        "steps/dapo/sampling.py": "from ..gsm8k import grade\n",
    })
    assert problems(root) == [
        f"pipeline/budget.py:1: pipeline.budget imports local.stand_in (costs) {UP}",
        f"steps/evaluate.py:3: steps.evaluate imports local.stand_in {UP}",
        f"steps/train.py:2: steps.train imports bench.loops {UP}",
        "steps/dapo/sampling.py:1: steps.dapo.sampling imports steps.gsm8k (grade) (steps/dapo/ imports nothing "
        "from steps/gsm8k/: the loop takes a task)",
        "import cycle in local/: local.faults -> local.models -> local.responses -> local.faults: "
        "local/faults.py:1; local/models.py:1; local/responses.py:2",
        # steps/gsm8k/__init__ imports steps/dapo/task: with the sampling arrow, the two sub-packages are a circle
        "import cycle in steps/: steps.dapo -> steps.gsm8k -> steps.dapo: steps/dapo/sampling.py:1; "
        "steps/gsm8k/__init__.py:1",
    ]


def test_a_module_importing_its_own_package_is_no_cycle_but_two_modules_are(tmp_path: Path) -> None:
    root = write(tmp_path, {"steps/__init__.py": "from steps import a\n", "steps/a.py": "import steps\n"})
    assert problems(root) == ["import cycle in steps/: steps -> steps.a -> steps: steps/__init__.py:1; steps/a.py:1"]
    (root / "steps/a.py").write_text("x = 1\n")
    assert problems(root) == []


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_folder_is_read(folder: str) -> None:
    assert any(name.split(".")[0] == folder for name in modules(ROOT)), folder


def test_a_group_with_more_than_one_circle_names_every_arrow_in_it(tmp_path: Path) -> None:
    root = write(tmp_path, {
        "local/__init__.py": "",
        "local/faults.py": "from local import responses\nfrom local.models import Session\n",
        "local/models.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from local.faults import Injector\n"),
        "local/responses.py": "from local.models import Session\n",
    })
    assert problems(root) == [
        "import cycle in local/: local.faults -> local.models -> local.faults: local/faults.py:2; local/models.py:3; "
        "also among local.faults, local.models, local.responses: "
        "local/faults.py:1 local.faults imports local.responses; local/responses.py:1 local.responses imports "
        "local.models"]


def test_two_sub_packages_in_a_circle_are_refused_though_no_two_modules_are(tmp_path: Path) -> None:
    # steps/a/x -> steps/b/y and steps/b/z -> steps/a/w: no module cycle, but steps/a and steps/b each lean on the
    # other, so neither is below; and the house's order holds too: steps/ below pipeline/, local/ below bench/.
    root = write(tmp_path, {
        "steps/__init__.py": "", "steps/a/__init__.py": "", "steps/b/__init__.py": "",
        "steps/a/x.py": "from steps.b import y\n", "steps/a/w.py": "",
        "steps/b/y.py": "", "steps/b/z.py": "from ..a import w\n",
        "steps/c/__init__.py": "import pipeline.start\n", "pipeline/__init__.py": "", "pipeline/start.py": "",
        "local/__init__.py": "from bench import loops\n", "bench/__init__.py": "", "bench/loops.py": "",
    })
    assert problems(root) == [
        f"steps/c/__init__.py:1: steps.c imports pipeline.start {UP}",
        f"local/__init__.py:1: local imports bench.loops {UP}",
        "import cycle in steps/: steps.a -> steps.b -> steps.a: steps/a/x.py:1; steps/b/z.py:1"]


MAX_LINES = 600  # a module longer than this holds more than one idea: split it


def test_no_product_file_is_over_600_lines() -> None:
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in modules(ROOT).values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert long == [], f"split these by idea (at most {MAX_LINES} lines each):\n  " + "\n  ".join(long)
