"""The job around the ranks: the launcher's environment, stopping for preemption, thread pools.

``jobenv`` reads what SLURM or another launcher says about the job, ``preemption`` stops every
rank at the same step when the job is signalled, ``threads`` sizes each rank's thread pools to
its share of the cores (docs/architecture.md, "The job").
"""

from .jobenv import JobEnv, detect, job_end_time
from .preemption import Preemption, requeue_file

__all__ = ["JobEnv", "detect", "job_end_time", "Preemption", "requeue_file"]
