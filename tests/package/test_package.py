"""Packaging promises: a light import, no import cycle among the package's modules, the info command,
optional dependencies stay optional, and pyproject.toml agrees with itself (one version, py.typed
shipped, one oldest Python, one ruff).

Building and installing the wheel is .ci/check_package's job (too slow for the suite)."""

import ast
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from support import launch

ROOT = Path(launch.ROOT)
SOURCE_VERSION = re.search(r'^__version__ = "([^"]+)"$', (ROOT / "hpc_c10d" / "__init__.py").read_text(), re.M)[1]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def _mpiexec() -> str:
    found = Path(sys.executable).with_name("mpiexec")
    return str(found) if found.exists() else shutil.which("mpiexec") or pytest.skip("no mpiexec")


def test_import_starts_nothing_heavy():
    result = _python(
        "import sys, hpc_c10d\n"
        "heavy = [m for m in ('mpi4py.MPI', 'torch', 'cupy', 'h5py') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert hpc_c10d.is_initialized() is False\n"
        "print(hpc_c10d.__version__)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == SOURCE_VERSION


def _package_imports() -> dict[str, set[str]]:
    """Each module of hpc_c10d -> the package modules it imports anywhere in it (inside functions
    and ``TYPE_CHECKING`` blocks too), read from the source."""
    modules = {}
    for path in (ROOT / "hpc_c10d").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    imports = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                start = f"{base}.{node.module}" if node.level and node.module else node.module or base
                targets = [f"{start}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:  # the deepest package module named
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        imports[name] = found
    return imports


def _cycle(imports: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among ``imports``, as the modules along it, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(imports[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(imports):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_no_module_of_the_package_imports_itself_back():
    """Layers, not circles: through its imports (module-level, ``TYPE_CHECKING`` and inside
    functions), no module of hpc_c10d reaches itself again."""
    cycle = _cycle(_package_imports())
    assert cycle is None, " -> ".join(cycle)


def test_transports_are_injected_and_read_no_package_state():
    """The groups get both transports from the registry (backend.py), so process_group imports
    neither; the NCCL transport is handed what it needs, so nothing in nccl/ reads the package's
    state. Imports inside functions count."""
    imports = _package_imports()
    assert not {m for m in imports["hpc_c10d.process_group"] if m.startswith(("hpc_c10d.nccl", "hpc_c10d.mpi"))}
    upward = {"hpc_c10d._state", "hpc_c10d.logs", "hpc_c10d.process_group", "hpc_c10d.lifecycle", "hpc_c10d"}
    reaching = {name: sorted(imports[name] & upward) for name in imports if name.startswith("hpc_c10d.nccl")}
    assert not any(reaching.values()), reaching


def test_works_without_torch_installed():
    result = _python(
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, hpc_c10d as dist\n"
        "dist.init_process_group()\n"
        "x = np.arange(3.0); dist.all_reduce(x)\n"
        "assert x.tolist() == [0.0, 1.0, 2.0]\n"
        "dist.destroy_process_group()\n"
    )
    assert result.returncode == 0, result.stderr


def test_availability_queries_never_raise():
    result = _python(
        "import hpc_c10d as dist\n"
        "print(dist.is_available(), dist.is_mpi_available(), dist.is_gloo_available(),\n"
        "      dist.is_ucc_available(), dist.is_xccl_available(), dist.is_backend_available('mpi'),\n"
        "      dist.is_backend_available('nonsense'), isinstance(dist.is_nccl_available(), bool))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True", "False", "False", "True", "False", "True"]


def test_info_command_reports_every_rank():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([_mpiexec(), "-n", "3", sys.executable, "-m", "hpc_c10d", "info"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "mpi4py" in out and "MPI library" in out and "thread level" in out and "NCCL library" in out
    assert "world size       3" in out and "\nthread pools     " in out  # the choice of hpc_c10d.threads
    assert " pid cpus threads gpus" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert sorted(int(r[0]) for r in rows) == [0, 1, 2]


def test_version_is_set_in_one_place():
    project = _pyproject()
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hpc_c10d.__version__"}
    try:
        installed = metadata.version("hpc-c10d")
    except metadata.PackageNotFoundError:
        return
    assert installed == SOURCE_VERSION, "the installed hpc-c10d is another version: reinstall it"


def test_py_typed_ships():
    project = _pyproject()
    assert (ROOT / "hpc_c10d" / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["hpc_c10d"]
    assert "Typing :: Typed" in project["project"]["classifiers"]


def test_mypy_checks_the_oldest_python():
    """mypy checks against the Python that requires-python names (ruff reads requires-python itself)."""
    project = _pyproject()
    assert project["project"]["requires-python"] == ">=" + project["tool"]["mypy"]["python_version"]


def test_extras_agree():
    """The suite's extra covers the optional parts it tests, and every extra pins the same ruff."""
    extras = _pyproject()["project"]["optional-dependencies"]
    assert set(extras["hdf5"]) | set(extras["plot"]) <= set(extras["test"])
    ruffs = {r for requirements in extras.values() for r in requirements if re.match(r"ruff\b", r)}
    assert len(ruffs) == 1 and next(iter(ruffs)).startswith("ruff=="), ruffs
