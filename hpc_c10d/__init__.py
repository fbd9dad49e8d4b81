"""hpc_c10d: the torch.distributed API on MPI, for supercomputer batch jobs.

``import hpc_c10d as dist`` and code written for ``torch.distributed`` runs under
``mpiexec``/``srun`` with no MASTER_ADDR, port or TCP store: MPI supplies ranks, world size and
the transport. Importing this package starts nothing; MPI starts in ``init_process_group``.
"""

import sys

from . import distributed_c10d
from . import nccl as nccl  # bind_local_device(); loads no CUDA library
from .diagnostics.debug import set_debug_level, set_debug_level_from_env
from .distributed_c10d import *  # noqa: F403 - the torch.distributed names
from .distributed_c10d import (  # private names torch users import ("x as x": re-exported)
    _all_gather_base as _all_gather_base,
    _get_default_group as _get_default_group,
    _get_default_store as _get_default_store,
    _make_nccl_premul_sum as _make_nccl_premul_sum,
    _reduce_scatter_base as _reduce_scatter_base,
    _world as _world,
)
from .distributed_c10d import __all__ as _c10d_all
from .errors import (
    DistBackendError, DistError, DistNetworkError, DistStoreError, ProcessFailedError, QueueEmptyError,
)
from .job import jobenv, preemption
from .job.preemption import Preemption
from .lifecycle import is_available
from .store import FileStore, HashStore, MPIStore
from .work import Future

__version__ = "0.1.0"

# The job's modules lived at the package's root before hpc_c10d.job: their old import paths still work.
sys.modules.update({f"{__name__}.jobenv": jobenv, f"{__name__}.preemption": preemption})

__all__ = [
    *_c10d_all, "distributed_c10d", "is_available", "set_debug_level", "set_debug_level_from_env",
    "DistError", "DistBackendError", "DistNetworkError", "DistStoreError", "ProcessFailedError", "QueueEmptyError",
    "Future", "HashStore", "FileStore", "MPIStore", "Preemption", "__version__",
]
