"""The house's floors: every import points down or sideways, and no project files import each other in a circle.

From the bottom: ``gpuyard.infra`` (typed stack config, the conventions both sides share, the Pulumi program), the
trainer ``gpuyard.jobs.workload`` (it runs inside the images), the job specs, renderers and tools of ``gpuyard.jobs``,
the simulated cluster ``gpuyard.sim``, and on top the ``gpuyard`` command in ``gpuyard.jobs.cli``. The folders
``infra/``, ``jobs/`` and ``sim/`` install as those packages (setup.py; tests/test_images_install.py), so that no name a user's script may have
(``jobs``, ``sim``) shadows or is shadowed by gpuyard's.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("infra", "jobs", "sim")
# Longest matching prefix wins; a module may import its own floor or the floors below it.
FLOORS = {"gpuyard.infra": 0, "gpuyard.jobs.workload": 1, "gpuyard.jobs": 2, "gpuyard.sim": 3, "gpuyard.jobs.cli": 4}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(["gpuyard", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES if (ROOT / package).is_dir()
            for path in sorted((ROOT / package).rglob("*.py"))}


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``module`` imports anywhere in its file (functions included)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    targets = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            targets.add(name)
    return targets


def floor(module: str) -> int:
    prefix = max((p for p in FLOORS if module == p or module.startswith(p + ".")), key=len)
    return FLOORS[prefix]


MODULES = project_modules()
GRAPH = {module: imported(module, path, set(MODULES)) for module, path in MODULES.items()}


def test_the_graph_is_the_real_one():
    assert {"gpuyard.infra.config", "gpuyard.jobs.render", "gpuyard.jobs.cli.main", "gpuyard.jobs.workload.train"} <= set(MODULES)
    assert "gpuyard.jobs.spec" in GRAPH["gpuyard.jobs.render.pytorchjob"]
    assert {"gpuyard.jobs.cli.render", "gpuyard.jobs.cli.env"} <= GRAPH["gpuyard.jobs.cli.main"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    upward = sorted(target for target in GRAPH[module] if floor(target) > floor(module))
    assert not upward, f"{module} (floor {floor(module)}) imports a higher floor: {upward}"


def test_no_import_cycles():
    """Tarjan's strongly connected components over module imports; a component of two or more is a cycle."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in GRAPH[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"
