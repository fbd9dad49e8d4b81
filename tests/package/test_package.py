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
        "heavy = [m for m in ('mpi4py.MPI', 'torch', 'cupy', 'h5py', 'ml_dtypes') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert hpc_c10d.is_initialized() is False\n"
        "print(hpc_c10d.__version__)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == SOURCE_VERSION


def test_ml_dtypes_loads_only_for_bfloat16():
    """A job that never uses bfloat16 never imports ml_dtypes (0.6 s of CPU a process, hpc_c10d/arrays.py
    says why); a bfloat16 array made with the user's own import of it is taken, then and after."""
    result = _python(
        "import sys, numpy as np, hpc_c10d as dist\n"
        "dist.init_process_group()\n"
        "x = np.arange(4, dtype=np.float32); dist.all_reduce(x); dist.broadcast(x, 0)\n"
        "assert 'ml_dtypes' not in sys.modules\n"
        "import ml_dtypes\n"
        "for _ in range(2):  # the first call admits the dtype, the second takes the fast path\n"
        "    y = np.arange(4).astype(ml_dtypes.bfloat16); dist.all_reduce(y, op=dist.ReduceOp.MAX)\n"
        "    assert y.dtype == ml_dtypes.bfloat16 and y.astype(np.float32).tolist() == [0, 1, 2, 3], y\n"
        "try:\n"
        "    dist.all_reduce(np.zeros(2, np.float128))\n"
        "except TypeError as e:\n"
        "    assert 'supported: bool' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('float128 was taken')\n"
        "dist.destroy_process_group()\n"
    )
    assert result.returncode == 0, result.stderr


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


def _defined(tree: ast.Module) -> set[str] | None:
    """The names a module binds anywhere (None if it star-imports: anything may be there)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update(alias.asname or alias.name.partition(".")[0] for alias in node.names)
    return names


def test_every_import_inside_the_package_names_what_is_there():
    """``from .x import y`` and ``from . import y`` inside hpc_c10d name a module or a name that
    module binds: a renamed module cannot leave a stale import behind in a function body that
    only an optional dependency (torch, CUDA) would run."""
    paths = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (ROOT / "hpc_c10d").rglob("*.py")}
    trees = {name: ast.parse(path.read_text()) for name, path in paths.items()}
    stale = []
    for name, tree in trees.items():
        package = name if paths[name].name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("hpc_c10d")):
                continue
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = f"{base}.{node.module}" if node.level and node.module else node.module or base
            if source not in trees:
                stale.append(f"{name}: no module {source}")
                continue
            bound = _defined(trees[source])
            stale += [f"{name}: {source} has no {alias.name}" for alias in node.names
                      if alias.name != "*" and f"{source}.{alias.name}" not in trees and bound is not None
                      and alias.name not in bound]
    assert not stale, "\n".join(stale)


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


# The package's layers, lowest first: a module imports only from its own layer or those below.
# The core and the facade are modules at the package's root; every other layer is a subpackage.
CORE = {"arrays", "backend", "errors", "extras", "options", "pg_methods", "process_group", "reduce_op", "settings",
        "state", "timeouts", "transport", "work"}
FACADE = {"", "_dist2", "collectives", "distributed_c10d", "groups", "lifecycle", "object_collectives", "p2p",
          "shrink"}
COMMANDS = {"__main__", "info"}
LAYERS = [("core", CORE), ("diagnostics", {"diagnostics"}), ("transports", {"mpi", "nccl"}), ("store", {"store"}),
          ("job", {"job"}), ("facade", FACADE), ("add-ons", {"checkpoint", "torch", "testing", "bench"}),
          ("commands", COMMANDS)]


def _layer(module: str) -> int:
    """The index in LAYERS of a module of hpc_c10d (by its first name under the package)."""
    first = module.removeprefix("hpc_c10d").removeprefix(".").partition(".")[0]
    found = [index for index, (_, names) in enumerate(LAYERS) if first in names]
    assert found, f"{module} is in no layer: add it to LAYERS"
    return found[0]


def test_each_layer_imports_only_downwards():
    """Core, diagnostics, transports, store, job, facade, add-ons, commands: the core never imports
    the debug aids or the job, a transport never the stores or the facade, and so on (imports
    inside functions and ``TYPE_CHECKING`` blocks count)."""
    upward = sorted(f"{module} ({LAYERS[_layer(module)][0]}) -> {target} ({LAYERS[_layer(target)][0]})"
                    for module, targets in _package_imports().items() for target in targets
                    if _layer(target) > _layer(module))
    assert not upward, "\n".join(upward)


def test_transports_are_injected_and_read_no_package_state():
    """The groups get both transports from the registry (backend.py), so process_group imports
    neither; the NCCL transport is handed what it needs, so nothing in nccl/ reads the package's
    state. Imports inside functions count."""
    imports = _package_imports()
    assert not {m for m in imports["hpc_c10d.process_group"] if m.startswith(("hpc_c10d.nccl", "hpc_c10d.mpi"))}
    upward = {"hpc_c10d.state", "hpc_c10d.diagnostics.logs", "hpc_c10d.process_group", "hpc_c10d.lifecycle",
              "hpc_c10d"}
    reaching = {name: sorted(imports[name] & upward) for name in imports if name.startswith("hpc_c10d.nccl")}
    assert not any(reaching.values()), reaching


def _documented_names() -> list[str]:
    """Every name docs/api.md documents, as a dotted path: ``automodule`` targets and the names of
    ``autofunction``/``autoclass``/``autodata`` under the ``currentmodule`` before them."""
    names, module = [], "hpc_c10d"
    for kind, target in re.findall(r"^\.\. (\w+):: (\S+)", (ROOT / "docs" / "api.md").read_text(), re.M):
        if kind == "currentmodule":
            module = target
        elif kind == "automodule":
            names.append(target)
        else:
            names.append(f"{module}.{target}")
    return names


def test_every_documented_import_path_works():
    """What api.md documents imports as written; so do the job's paths from before hpc_c10d.job
    (``hpc_c10d.jobenv``, ``hpc_c10d.preemption``), as the same modules."""
    names = _documented_names()
    assert len(names) > 80 and "hpc_c10d.job" in names, names
    result = _python(
        "import importlib, sys\n"
        f"for name in {[n for n in names if not n.startswith('hpc_c10d.torch')]!r}:\n"
        "    module, _, attr = name.rpartition('.')\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError:\n"
        "        getattr(importlib.import_module(module), attr)\n"
        "import hpc_c10d.jobenv, hpc_c10d.preemption, hpc_c10d.job\n"
        "from hpc_c10d.jobenv import JobEnv, detect, job_end_time\n"
        "from hpc_c10d.preemption import Preemption, requeue_file\n"
        "assert hpc_c10d.jobenv is hpc_c10d.job.jobenv and hpc_c10d.preemption is hpc_c10d.job.preemption\n"
        "assert Preemption is hpc_c10d.Preemption is hpc_c10d.job.Preemption\n"
    )
    assert result.returncode == 0, result.stderr


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
    assert "world size       3" in out and "\nthread pools     " in out  # the choice of hpc_c10d.job.threads
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
