"""The local service's modules import only the layers below them (local/training_session/__init__.py), so
there is no import cycle; and the product's cost estimate owns its figures, importing nothing from local/."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "local" / "training_session"
#: Each module's layer: a module may import only modules of a lower layer (toy/ is below them all).
LAYERS = {"exceptions": 0, "settings": 0, "costs": 1, "registry": 1, "work": 2, "sessions": 3, "models": 4,
          "responses": 5, "metering": 5, "sickness": 5, "faults": 6, "server": 7, "__main__": 8, "__init__": 0}


def imported(path: Path) -> set[str]:
    """Every module an import in ``path`` names: at the top, in a function or under TYPE_CHECKING alike."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def service_imports(path: Path) -> set[str]:
    """The service modules (toy/ aside) that ``path`` imports."""
    prefix = "local.training_session."
    return {name[len(prefix):].split(".")[0] for name in imported(path) if name.startswith(prefix)} - {"toy"}


def test_every_service_module_imports_only_layers_below_it():
    modules = {p.stem for p in SERVICE.glob("*.py")}
    assert modules == set(LAYERS), "place a new module in LAYERS and in local/training_session/__init__.py"
    upward = {(p.stem, dep) for p in SERVICE.glob("*.py") for dep in service_imports(p) & modules
              if LAYERS[dep] >= LAYERS[p.stem]}
    assert not upward, upward
    toy = {(p.name, dep) for p in (SERVICE / "toy").glob("*.py") for dep in service_imports(p)}
    assert not toy, toy


def test_the_cost_estimate_and_its_figures_import_nothing_from_local_or_bench():
    for module in ("budget", "throughput"):
        outside = {name for name in imported(ROOT / "pipeline" / f"{module}.py")
                   if name.split(".")[0] in ("local", "bench")}
        assert not outside, (module, outside)
