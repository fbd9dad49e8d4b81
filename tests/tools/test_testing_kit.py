"""The testing kit (hpc_c10d.testing): the pytest plugin run under mpiexec at 1-3 ranks (the
tutorial example at 1-4) on the cases in tests/programs/kit_cases/, ``run_at_world_size`` from
this serial process, and (marked mpi) ``assert_same_on_ranks`` inside the suite's own world.

The plugin's runs are serial tests that start their own jobs: each copies one case file into
its tmp_path and runs ``mpiexec -n N python -m pytest --hpc-c10d`` there, then reads rank 0's
report. The tutorial example of docs/testing_your_code.md (examples/tensor_parallel) runs the same way.
"""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import hpc_c10d as dist
from support.launch import ROOT, flavour, fresh_env, job_sizes, launch, mpiexec_command, outer_world_size
from hpc_c10d.testing import assert_same_on_ranks, run_at_world_size

CASES = os.path.join(ROOT, "tests", "programs", "kit_cases")
TIMEOUT_S = 120
SIZES = job_sizes(1, 2, 3)  # one rank, an even and an odd size; the tutorial example also runs at 4
# examples/tensor_parallel/test_layers.py: what passes and skips at each size
EXAMPLE_COUNTS = {1: {"passed": 2, "skipped": 3}, 2: {"passed": 5}, 3: {"passed": 4, "skipped": 1}, 4: {"passed": 5}}

serial = pytest.mark.skipif(outer_world_size() > 1, reason="serial test that starts its own jobs; run without mpiexec")


def run_cases(tmp_path, case, ranks, *args, launcher_flags=(), kit=True, env=None):
    """``mpiexec [launcher_flags] -n ranks python -m pytest --hpc-c10d <case> *args`` in tmp_path, under
    ``timeout`` (without ``--hpc-c10d`` when not ``kit``): (exit status, rank 0's report and every rank's
    stderr)."""
    shutil.copy(os.path.join(CASES, case), tmp_path / case)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    cmd = ["timeout", str(TIMEOUT_S), *mpiexec_command(ranks)[:-2], *launcher_flags, "-n", str(ranks),
           sys.executable, "-m", "pytest", "-p", "hpc_c10d.testing.pytest_plugin", *(["--hpc-c10d"] if kit else []),
           "-p", "no:cacheprovider", "--color=no", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
           str(tmp_path / case), *args]
    done = subprocess.run(cmd, env=fresh_env(CI="1", **(env or {})), cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT_S + 30)
    return done.returncode, done.stdout + done.stderr


def summary(output):
    """pytest's last line on rank 0, e.g. '1 failed, 2 passed in 0.31s', without the colours."""
    # pytest's own line ends "in 0.31s"; MPI's warnings may say "... fd 21 failed" after it
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped).* in [\d.]+s", line)]
    assert lines, output
    return re.sub(r"=+|\x1b\[[0-9;]*m", "", lines[-1]).strip()


def counts(output):
    return {what: int(n) for n, what in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary(output))}


@serial
@pytest.mark.parametrize("ranks", SIZES)
def test_agreeing_tests_pass_and_only_rank_0_reports(tmp_path, ranks):
    status, output = run_cases(tmp_path, "test_agreeing.py", ranks, "--with-mpi", "-rs")
    assert status == 0, output
    # all_reduce, subgroup+store, temp paths; world_size(2, 4); world_size(min_size=3); mpi(min_size=2)+max 3
    passed = 3 + (ranks in (2, 4)) + (ranks >= 3) + (2 <= ranks <= 3)
    assert counts(output) == {"passed": passed, "skipped": 8 - passed}, output
    assert output.count("test session starts") == 1, output  # one report for the whole job
    if ranks not in (2, 4):
        assert f"needs world size one of [2, 4]; this run has {ranks}" in output, output
    if ranks == 4:
        assert "needs world size <= 3; this run has 4" in output, output
    if ranks > 1:  # one rank skipped, the others would have passed: skipped on every rank, saying why
        assert f"skipped on rank {ranks - 1}: the last rank lacks something" in output, output


@serial
@pytest.mark.parametrize("ranks", SIZES)
def test_a_failure_on_one_rank_fails_everywhere_and_is_reported_once_with_the_rank(tmp_path, ranks):
    xml = tmp_path / "report.xml"
    status, output = run_cases(tmp_path, "test_one_rank_fails.py", ranks, f"--junitxml={xml}")
    assert status == 1, output
    assert counts(output) == {"failed": 1 + (ranks > 1), "passed": 2 - (ranks > 1), "error": 1}, output
    last = ranks - 1
    assert f"ERROR test_one_rank_fails.py::test_needs_a_fixture_that_breaks - failed on ranks [{last}]: " \
           "RuntimeError: the last rank's fixture broke" in output, output
    assert f"failed on ranks [{last}]" in output, output
    assert output.count("E       AssertionError: the last rank's own check failed (broadcast gave 0)") == 1, output
    assert f"FAILED test_one_rank_fails.py::test_fails_on_the_last_rank - failed on ranks [{last}]: " \
           "AssertionError: the last rank's own check failed" in output, output
    # assert_same_on_ranks fails on every rank alike: one report, the ranks named
    if ranks > 1:
        assert f"failed on ranks {list(range(ranks))}" in output, output
        assert f"rank {last} hold(s) something else than rank 0" in output, output
    # one JUnit XML file (rank 0's), with the agreed verdicts
    text = xml.read_text()
    assert text.count("<failure") == 1 + (ranks > 1) and text.count("<error") == 1, text
    assert f"failed on ranks [{last}]" in text, text


@serial
@pytest.mark.parametrize("ranks", SIZES)
def test_a_test_waiting_in_python_fails_at_its_limit_and_the_run_goes_on(tmp_path, ranks):
    status, output = run_cases(tmp_path, "test_python_hang.py", ranks)
    assert status == 1, output
    assert counts(output) == {"failed": 1, "passed": 1}, output
    assert "failed on ranks [0]" in output and "time limit of 2 s exceeded in Python code" in output, output
    assert "time.sleep(0.05)" in output, output  # where rank 0 was
    assert "who is where" in output and f"dumps from {ranks} of {ranks} ranks" in output, output
    assert "the default group was made afresh 1 time(s)" in output, output


@serial
@pytest.mark.parametrize("ranks", (2,))
def test_a_store_wait_past_the_limit_is_named_with_its_keys(tmp_path, ranks):
    status, output = run_cases(tmp_path, "test_store_hang.py", ranks)
    assert status == 1, output
    assert counts(output) == {"failed": 1, "passed": 1}, output
    assert "time limit of 2 s exceeded in MPIStore.wait(['hpc_c10d-test/test_store_hang.py::" \
           "test_rank_0_waits_for_a_key_nobody_sets/never-set'])" in output, output
    assert "Python code" not in output, output


@serial
@pytest.mark.parametrize("ranks", job_sizes(2, 3))
def test_a_collective_only_rank_0_enters_is_failed_at_its_limit_naming_the_op(tmp_path, ranks):
    status, output = run_cases(tmp_path, "test_hangs.py", ranks)
    assert status != 0, output
    assert "failed on ranks [0]" in output, output
    assert "time limit of 3 s exceeded in all_reduce seq 1 of group 0 float32[4]" in output, output
    others = f"ranks 1-{ranks - 1}" if ranks > 2 else "rank 1"
    assert f"group 0 (default_pg): rank 0 in all_reduce seq 1 of group 0 float32[4]; {others} not inside any " \
           "operation" in output, output
    # this MPI cannot end a blocking call: the run ends, with rank 0's report
    assert "rank 0 stayed blocked inside MPI" in output, output
    assert counts(output) == {"failed": 1, "skipped": 1}, output
    assert "hpc_c10d: the run ended at test_hangs.py::test_only_rank_0_all_reduces: failed on ranks [0]" in output


@serial
def test_a_watchdog_ending_the_job_is_heard_through_pytests_capture(tmp_path):
    """The group's timeout (1 s) comes before the test's limit (3 s): the watchdog aborts the job, and its
    report, which pytest's capture and log handler would have kept until the process died, is output."""
    status, output = run_cases(tmp_path, "test_hangs.py", 2, env={"HPC_C10D_TIMEOUT": "1"})
    assert status != 0, output
    assert "[rank 0] Watchdog caught collective operation timeout: all_reduce seq 1 of group 0 float32[4] has " \
           "not completed after" in output, output
    assert "what every rank was doing" in output and "rank 1 not inside any operation" in output, output


@serial
@pytest.mark.parametrize("ranks, hang", [(3, "0"), (2, "last")])  # the stuck rank is rank 0, or another
def test_a_run_ended_by_a_hang_keeps_every_report_and_its_junit_xml(tmp_path, ranks, hang):
    xml = tmp_path / "report.xml"
    status, output = run_cases(tmp_path, "test_report_kept.py", ranks, "-rA", f"--junitxml={xml}",
                               env={"HANG_RANK": hang})
    assert status == 1, output
    stuck = 0 if hang == "0" else ranks - 1
    at = "test_report_kept.py::test_one_rank_all_reduces"
    assert counts(output) == {"failed": 2, "skipped": 3}, output  # the last line counts every test
    assert output.count("test session starts") == 1, output
    # the earlier failure's section, with its traceback, and the short summary of every test
    assert "_ test_fails_first _" in output and "AssertionError: every rank fails this one" in output, output
    assert f"FAILED test_report_kept.py::test_fails_first - failed on ranks {list(range(ranks))}" in output, output
    assert f"FAILED {at} - failed on ranks [{stuck}]: time limit of 3 s exceeded in all_reduce" in output, output
    assert f"SKIPPED [1] test_report_kept.py:21: not run: the run ended at {at}" in output, output
    assert f"SKIPPED [2] test_report_kept.py:25: not run: the run ended at {at}" in output, output
    # JUnit XML: the failures, the hung test with its report, the tests not run as skipped
    root = ET.parse(xml).getroot()
    cases = {case.get("name"): case for case in root.iter("testcase")}
    assert list(cases) == ["test_fails_first", "test_one_rank_all_reduces", "test_later", "test_later_too[1]",
                           "test_later_too[2]"], ET.tostring(root)
    assert cases["test_fails_first"].find("failure") is not None
    hung = cases["test_one_rank_all_reduces"].find("failure")
    assert hung is not None and "who is where" in hung.text and "stayed blocked inside MPI" in hung.text
    for name in ("test_later", "test_later_too[1]", "test_later_too[2]"):
        skipped = cases[name].find("skipped")
        assert skipped is not None and skipped.get("message") == f"not run: the run ended at {at}", name


@serial
@pytest.mark.skipif(flavour().name != "openmpi", reason="ULFM (revoking a communicator) is Open MPI 5's, "
                    "under mpiexec --with-ft ulfm; the MPI here is another")
@pytest.mark.parametrize("ranks", (2, 3))  # not job_sizes: Open MPI's stage is the only one where it runs
def test_under_ulfm_a_blocked_collective_is_freed_and_the_run_goes_on(tmp_path, ranks):
    status, output = run_cases(tmp_path, "test_hangs.py", ranks, launcher_flags=("--with-ft", "ulfm"))
    assert status == 1, output
    assert counts(output) == {"failed": 1, "passed": 1}, output
    assert "time limit of 3 s exceeded in all_reduce seq 1 of group 0 float32[4]" in output, output
    assert "MPI_ERR_REVOKED" in output, output
    assert "the default group was made afresh 1 time(s)" in output, output


@serial
@pytest.mark.parametrize("ranks", job_sizes(1, 3))
def test_with_the_kit_off_the_last_line_says_what_was_not_run(tmp_path, ranks):
    status, output = run_cases(tmp_path, "test_agreeing.py", ranks, kit=False)
    assert status == 0, output
    # every test but the two pytest-mpi ones (skipped without --with-mpi) needs a fixture of the kit
    warning = ("hpc_c10d: 6 test(s) skipped, not run: they need the testing kit, which is off; "
               "run pytest with --hpc-c10d")
    alone = f"(without it each of the {ranks} ranks ran the whole session on its own)"
    said = [line for line in output.splitlines() if warning in line]
    assert len(said) == ranks and all((alone in line) == (ranks > 1) for line in said), output  # each on its own
    assert re.search(r"8 skipped in [\d.]+s =*\n" + re.escape(warning), output), output  # after pytest's last line


@serial
def test_ranks_that_collect_different_tests_are_stopped_before_any_runs(tmp_path):
    status, output = run_cases(tmp_path, "test_rank_dependent.py", 3)
    assert status == 4, output  # pytest's usage error
    assert "ranks [1, 2] collected other tests than rank 0 (rank 0: 1, rank 1: 2, rank 2: 3 tests)" in output, output


@serial
@pytest.mark.parametrize("ranks", job_sizes(1, 2, 3, 4))  # what passes and skips differs at each size
def test_the_tutorial_example_passes(tmp_path, ranks):
    example = os.path.join(ROOT, "examples", "tensor_parallel")
    argv = ["-m", "pytest", "-p", "hpc_c10d.testing.pytest_plugin", "--hpc-c10d", "-p", "no:cacheprovider",
            "--rootdir", example, os.path.join(example, "test_layers.py")]
    done, _ = launch(ranks, argv, TIMEOUT_S, env={"CI": "1"}, cwd=str(tmp_path))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert counts(output) == EXAMPLE_COUNTS[ranks], output


# ------------------------------------------------------------------ run_at_world_size
def rank_and_total(scale):
    """Run by run_at_world_size on every rank of a fresh job."""
    x = np.array([dist.get_rank() + 1.0])
    dist.all_reduce(x)
    return dist.get_rank(), dist.get_world_size(), float(x[0]) * scale


def fails_on_rank_1():
    assert dist.get_rank() != 1, "rank 1 disagrees"


def only_rank_0_all_reduces():
    if dist.get_rank() == 0:
        dist.all_reduce(np.ones(1))


def _launcher(ranks):
    """The job imports this file, whose imports need tests/ (support) on the path."""
    env = fresh_env()
    env["PYTHONPATH"] = os.pathsep.join((os.path.join(ROOT, "tests"), env["PYTHONPATH"]))
    return {"launcher": mpiexec_command(ranks)[:-2], "env": env}


@serial
@pytest.mark.parametrize("ranks", SIZES)
def test_run_at_world_size_returns_every_ranks_value(ranks):
    results = run_at_world_size(ranks, rank_and_total, 2.0, **_launcher(ranks))
    assert results == [(r, ranks, ranks * (ranks + 1.0)) for r in range(ranks)]


@serial
def test_run_at_world_size_names_the_failing_rank_with_its_traceback():
    with pytest.raises(AssertionError) as failure:
        run_at_world_size(3, fails_on_rank_1, **_launcher(3))
    text = str(failure.value)
    assert "fails_on_rank_1 at world size 3 failed on ranks [1]" in text
    assert "AssertionError: rank 1 disagrees" in text and "---------- rank 1 ----------" in text


@serial
def test_run_at_world_size_ends_a_job_that_hangs():
    with pytest.raises(AssertionError, match="only_rank_0_all_reduces at world size 2 did not finish within 5 s"):
        run_at_world_size(2, only_rank_0_all_reduces, timeout=5, **_launcher(2))


def test_run_at_world_size_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        run_at_world_size(0, rank_and_total)
    with pytest.raises(ValueError, match="must be a module-level function"):
        run_at_world_size(1, lambda: None)


# ------------------------------------------------------------------ assert_same_on_ranks
@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.complex64, np.bool_])
def test_same_arrays_pass_on_every_rank(world, dtype):
    assert_same_on_ranks(np.arange(6).reshape(2, 3).astype(dtype))


@pytest.mark.mpi
def test_a_rank_with_another_array_fails_on_every_rank_naming_it(world, rank, size):
    if size == 1:
        pytest.skip("needs a second rank to differ")
    value = np.zeros(3) + (rank == size - 1)
    with pytest.raises(AssertionError, match=rf"rank {size - 1} hold\(s\) something else than rank 0"):
        assert_same_on_ranks(value)


@pytest.mark.mpi
def test_tolerances_nans_shapes_dtypes_and_objects(world, rank, size):
    assert_same_on_ranks(np.array([1.0, np.nan]) + rank * 1e-9, rtol=1e-6)
    assert_same_on_ranks({"step": 3, "names": ["a", "b"]})
    if size == 1:
        return
    with pytest.raises(AssertionError, match="differs between ranks"):
        assert_same_on_ranks(np.ones(2 + (rank == 1)))
    with pytest.raises(AssertionError, match="differs between ranks"):
        assert_same_on_ranks(np.ones(2, dtype=np.float32 if rank else np.float64))
    with pytest.raises(AssertionError, match="step differs between ranks"):
        assert_same_on_ranks(rank, what="step")


@pytest.mark.mpi
def test_torch_tensors_compare_by_value(world, rank, size):
    torch = pytest.importorskip("torch")
    assert_same_on_ranks(torch.arange(4, dtype=torch.bfloat16))
    if size > 1:
        with pytest.raises(AssertionError, match="differs between ranks"):
            assert_same_on_ranks(torch.full((2,), float(rank)))
