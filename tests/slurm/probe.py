"""Write ``<dir>/rank<N>.json`` per rank: what MPI and the job environment say (tests/launch/test_slurm.py)."""
import json
import os
import sys
from dataclasses import asdict

import hpc_c10d as dist
from hpc_c10d.job import jobenv

dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
job = jobenv.detect()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
    json.dump({"mpi_rank": rank, "mpi_size": size, "local_rank": dist.get_node_local_rank(), **asdict(job),
               "disagreements": job.disagreements(rank, size)}, out)
dist.destroy_process_group()
