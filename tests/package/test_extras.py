"""install_hint: the pip commands it gives match the extras in pyproject.toml, as installed."""

import shlex
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hpc_c10d.extras import extra_requirements, gpu_install_hint, install_hint
from support.launch import ROOT

PYPROJECT = Path(ROOT) / "pyproject.toml"
STALE = "the installed hpc-c10d predates pyproject.toml's extras: reinstall it (pip install '.[mpich,test]')"


def _pyproject_extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]


def _normal(requirements: list[str]) -> set[str]:
    """Requirements as packaging writes them (metadata reorders version specifiers)."""
    return {str(Requirement(r)) for r in requirements}


@pytest.fixture
def installed():
    try:
        metadata.distribution("hpc-c10d")
    except metadata.PackageNotFoundError:
        pytest.skip("hpc-c10d is not installed (a checkout on PYTHONPATH has no extras metadata)")


def test_hint_names_the_packages(installed):
    assert install_hint("hdf5") == "pip install h5py"


def test_hint_quotes_a_requirement_with_a_version_range(installed):
    hint = install_hint("torch")
    assert hint.startswith("pip install '"), hint  # quoted: '<' and '>' would be shell redirections
    command = shlex.split(hint)
    assert command[:2] == ["pip", "install"], hint
    assert _normal(command[2:]) == _normal(_pyproject_extras()["torch"]), STALE


def test_unknown_extra_gives_the_checkout_form():
    assert install_hint("nonesuch") == "pip install '.[nonesuch]' (in the hpc_c10d checkout)"


def test_checkout_form_when_not_installed(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "requires", not_installed)
    assert extra_requirements("hdf5") == []
    assert install_hint("hdf5") == "pip install '.[hdf5]' (in the hpc_c10d checkout)"


def test_every_extra_yields_what_pyproject_lists(installed):
    extras = _pyproject_extras()
    assert set(metadata.metadata("hpc-c10d").get_all("Provides-Extra")) == set(extras), STALE
    for extra, listed in extras.items():
        assert _normal(extra_requirements(extra)) == _normal(listed), f"extra {extra!r}: {STALE}"


def test_gpu_hint_names_both_cuda_generations(installed):
    hint = gpu_install_hint()
    assert install_hint("cuda13") in hint and install_hint("cuda12") in hint
    assert "hpc-c10d[" not in hint
