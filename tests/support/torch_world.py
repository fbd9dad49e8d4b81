"""torch's default group on backend "hpc", shared by the tests that use torch.

Every MPI rank of a pytest run initialises torch.distributed once, with backend "hpc" and the
``mpi://`` rendezvous, beside hpc_c10d's own default group (conftest). The group stays up for
the whole session; MPIStore's exit hook frees the rendezvous store.
"""
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'torch>=2.11,<2.16')")
tdist = pytest.importorskip("torch.distributed")

from hpc_c10d.torch import BACKEND_NAME, register  # noqa: E402


def _guest_watchdog():
    """The watchdog torch's default group starts writes its dumps and alarm files into a directory
    the ranks share, made here and removed at exit, and holds no roll call (no ports)."""
    import atexit
    import shutil
    import tempfile

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    folder = comm.bcast(tempfile.mkdtemp(prefix="hpc_c10d-traces-") if comm.Get_rank() == 0 else None)
    if comm.Get_rank() == 0:
        atexit.register(shutil.rmtree, folder, True)
    os.environ.setdefault("HPC_C10D_TRACE_DIR", folder)
    os.environ.setdefault("HPC_C10D_ABORT_GRACE", "0")


def torch_world():
    """torch's default group on backend "hpc" (initialised on first use)."""
    if not tdist.is_initialized():
        register()
        _guest_watchdog()
        tdist.init_process_group(BACKEND_NAME, init_method="mpi://")
    return tdist.group.WORLD


def sizes_only(*sizes):
    """Skip unless the MPI world has one of ``sizes`` ranks (for tests that need a partner)."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    return pytest.mark.skipif(size not in sizes, reason=f"runs at {sizes} ranks; this run has {size}")
