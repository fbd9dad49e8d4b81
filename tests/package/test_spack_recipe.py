"""The Spack recipe (spack/) lints and formats as spack-packages' own recipes do, and compiles.

CI has no Spack; spack/ruff.toml carries spack-packages' ruff rules. The offline install, spec,
`spack test run` and module checks are in the note of the Spack issue."""
import importlib.util
import os
import py_compile
import subprocess

import pytest

from support.launch import ROOT, beside_python

SPACK_DIR = os.path.join(ROOT, "spack")
RECIPES = [os.path.join(d, "package.py") for d, _, files in os.walk(SPACK_DIR) if "package.py" in files]
RUFF = beside_python("ruff")  # the test extra's ruff is in the virtual environment, maybe not on PATH


def test_there_is_a_recipe_for_the_package():
    assert any(p.endswith(os.path.join("packages", "py_hpc_c10d", "package.py")) for p in RECIPES), RECIPES
    with open(os.path.join(SPACK_DIR, "spack_repo", "hpc_c10d", "repo.yaml")) as repo:
        assert "namespace: hpc_c10d" in repo.read()


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: os.path.relpath(p, SPACK_DIR))
def test_recipe_compiles(recipe, tmp_path):
    py_compile.compile(recipe, cfile=str(tmp_path / "recipe.pyc"), doraise=True)


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="the ruff package is not installed")
def test_the_installed_ruff_is_found_without_its_bin_on_path():
    assert RUFF is not None, "ruff is installed in this Python but the style tests would skip"


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed (pip install '.[test]')")
@pytest.mark.parametrize("check", [["check", "--no-fix"], ["format", "--check", "--diff"]], ids=["lint", "format"])
def test_recipes_pass_spack_packages_style(check):
    proc = subprocess.run([RUFF, *check, "--no-cache", "spack/"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
