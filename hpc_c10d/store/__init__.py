"""Key-value stores with torch's c10d Store contract.

``Store`` is the base class (subclass it in Python to plug in your own), ``HashStore`` lives in
one process, ``FileStore`` in a shared file, ``PrefixStore`` namespaces another store, and
``MPIStore`` (the default store of ``init_process_group``) lives in the ranks' own memory
through MPI one-sided communication, with no server and no port.
"""

from .base import Store
from .file_store import FileStore
from .hash_store import HashStore
from .mpi_store import MPIStore
from .prefix_store import PrefixStore

__all__ = ["Store", "HashStore", "FileStore", "PrefixStore", "MPIStore"]
