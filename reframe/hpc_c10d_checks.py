"""ReFrame checks a centre runs after installing hpc_c10d: the collectives, the store, an HDF5
checkpoint round trip and the torch backend at several rank counts, each result checked against
numpy by ``python -m hpc_c10d bench``, with timings compared to per-system references.

Run from the environment hpc_c10d is installed in (its ``python`` and ``mpiexec`` on PATH):

    reframe -C reframe/settings.py --system local -c reframe/hpc_c10d_checks.py -r

docs/centres.md says how, and how to add a system's references.
"""
import importlib.util

import reframe as rfm
import reframe.utility.sanity as sn
from reframe.core.builtins import parameter, performance_function, run_after, run_before, sanity_function, variable


def _column(name):
    """The position of ``name`` in the bench's CSV rows."""
    return ["bench", "op", "impl", "ranks", "bytes", "count", "dtype", "redop", "device", "mode", "iters",
            "rounds", "us_min", "us_median", "us_max", "algbw_gbs", "busbw_gbs", "wrong"].index(name)


def _exited_cleanly(check):
    """Exit status 0, where the scheduler tells it (squeue's backend cannot: it has no accounting)."""
    return sn.assert_true(check.job.exitcode in (0, None), msg=f"exit status {check.job.exitcode}")


class BenchCheck(rfm.RunOnlyRegressionTest):
    """One ``python -m hpc_c10d bench`` sub-benchmark: exit status 0, every row checked right."""

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    executable = "python"
    bench = variable(str)
    bench_options = variable(list, value=[])
    needs = variable(str, type(None), value=None)  # a package the sub-benchmark needs: skipped without it
    maintainers = ["hpc_c10d"]
    tags = {"hpc_c10d"}

    num_tasks = 2

    @run_after("init")
    def skip_without_what_it_needs(self):
        if self.needs is not None:
            self.skip_if(importlib.util.find_spec(self.needs) is None, f"{self.needs} is not installed")

    @run_before("run")
    def set_command(self):
        self.executable_opts = ["-m", "hpc_c10d", "bench", self.bench, "--format", "csv", *self.bench_options]

    @sanity_function
    def every_result_right(self):
        rows = sn.extractall(rf"^{self.bench},.*$", self.stdout)
        wrong = rf"^{self.bench},(?:[^,]*,){{{_column('wrong')}}}[1-9]"  # a row whose check counted wrong values
        return sn.all([_exited_cleanly(self), sn.assert_gt(sn.count(rows), 0), sn.assert_not_found(wrong, self.stdout)])

    def median_us(self, op, size):
        """The median time of ``op`` at ``size`` bytes, in µs, from the CSV rows."""
        skip = _column("us_median") - _column("bytes") - 1
        return sn.extractsingle(rf"^{self.bench},{op},[^,]*,\d+,{size},(?:[^,]*,){{{skip}}}([\d.]+),",
                                self.stdout, 1, float)


@rfm.simple_test
class CollectivesCheck(BenchCheck):
    """Every collective from 8 B to 64 KiB at ``ranks`` ranks, checked against numpy (an odd
    count among them: it catches what even ones hide)."""

    ranks = parameter([2, 3])
    bench = "collectives"
    bench_options = ["--ops", "all", "-b", "8:64K", "-f", "64", "-r", "3"]

    @run_after("init")
    def set_ranks(self):
        self.num_tasks = self.ranks


@rfm.simple_test
class LatencyCheck(BenchCheck):
    """all_reduce at 8 B and 64 KiB on 2 ranks, against the system's reference (median µs)."""

    bench = "collectives"
    bench_options = ["--ops", "all_reduce", "-b", "8:64K", "-f", "8192", "-r", "5"]
    reference = {
        # the project's CI machine (2 cores, MPICH 5.0.2 over shared memory), generous for a shared VM
        "local:default": {"all_reduce_8B": (5.0, None, 4.0, "us"), "all_reduce_64KiB": (40.0, None, 4.0, "us")},
        "*": {"all_reduce_8B": (None, None, None, "us"), "all_reduce_64KiB": (None, None, None, "us")},
    }

    @performance_function("us")
    def all_reduce_8B(self):  # noqa: N802 - the reference's name
        return self.median_us("all_reduce", 8)

    @performance_function("us")
    def all_reduce_64KiB(self):  # noqa: N802
        return self.median_us("all_reduce", 65536)


@rfm.simple_test
class StoreCheck(BenchCheck):
    """MPIStore's operations on every rank at once (the default store, in MPI windows)."""

    bench = "stores"
    bench_options = ["-r", "3"]
    reference = {"*": {"get": (None, None, None, "us"), "add": (None, None, None, "us")}}

    @performance_function("us")
    def get(self):
        return self.median_us("get", 16)

    @performance_function("us")
    def add(self):
        return self.median_us("add", 16)


@rfm.simple_test
class CheckpointCheck(BenchCheck):
    """An HDF5 checkpoint saved and loaded by every rank, read back and compared."""

    bench = "checkpoint"
    bench_options = ["--size", "16M", "-r", "2", "--dir", "."]
    needs = "h5py"


@rfm.simple_test
class TorchBackendCheck(BenchCheck):
    """torch.distributed on backend "hpc" against raw mpi4py."""

    bench = "torch"
    bench_options = ["-b", "8:64K", "-r", "2"]
    needs = "torch"


@rfm.simple_test
class InfoCheck(rfm.RunOnlyRegressionTest):
    """``python -m hpc_c10d info`` at 2 ranks: the MPI library, one world of both ranks."""

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    num_tasks = 2
    executable = "python"
    executable_opts = ["-m", "hpc_c10d", "info"]
    tags = {"hpc_c10d"}

    @sanity_function
    def one_world(self):
        return sn.all([_exited_cleanly(self), sn.assert_found(r"^MPI library\s+\S", self.stdout),
                       sn.assert_found(r"^world size\s+2 on", self.stdout)])
