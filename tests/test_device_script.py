"""The GPU device run (tests/gpu/): its step list, its summary format, its verdicts on pytest's
closing lines, and its GPU steps run dry here, where there is no GPU.

The run itself happens on a lent GPU machine; `bash tests/gpu/dry_run.sh` (CI) runs all of it in
a Python 3.12 venv made the way that machine is.
"""
import os
import subprocess
import sys

import pytest

import _launch

sys.path.insert(0, os.path.join(_launch.ROOT, "tests", "gpu"))
import device_steps as device  # noqa: E402

GPU_TESTS = ["nccl-gpu-tests", "one-gpu-two-ranks", "torch-cuda-tests", "checkpoint-gpu"]


def test_every_step_is_named_timed_and_placed():
    names = [s.name for s in device.STEPS]
    assert len(set(names)) == len(names)
    assert all(device.SUMMARY_LINE.match(device.summary_line(n, "PASS", 1.0, "x")) for n in names)
    assert {s.part for s in device.STEPS} == {"check", "bench"}
    parts = [s.part for s in device.STEPS]
    assert parts == sorted(parts, key=["check", "bench"].index)  # the checks first: the budget ends with numbers
    assert all(0 < s.timeout_s <= device.BUDGET_S for s in device.STEPS)
    assert device.BUDGET_S <= 420  # 7 minutes: a second call fits the device time
    for step in device.STEPS:
        assert step.gpu or step.part == "check"
        if "pytest" in step.argv:  # a GPU pytest step says how many of its tests must run there
            assert step.expect is not None and step.expect.passed > 0
        assert all(os.path.exists(os.path.join(_launch.ROOT, a)) for a in step.argv if a.startswith("tests/"))
    assert [s.name for s in device.steps_of("check", [])] == [s.name for s in device.STEPS if s.part == "check"]
    assert [s.name for s in device.steps_of("all", ["mpi", "info"])] == ["mpi", "info"]
    with pytest.raises(SystemExit, match="no step nope"):
        device.steps_of("all", ["nope"])


@pytest.mark.parametrize("verdict", device.VERDICTS)
def test_summary_lines_read_back(verdict):
    line = device.summary_line("nccl-gpu-tests", verdict, 12.34, "63 passed,\n 2 skipped")
    found = device.SUMMARY_LINE.match(line)
    assert found and found["step"] == "nccl-gpu-tests" and found["verdict"] == verdict
    assert found["seconds"] == "12.3" and found["detail"] == "63 passed, 2 skipped"


@pytest.mark.parametrize("output, ok", [
    ("===== 63 passed, 2 skipped in 9.81s =====", True),
    ("63 passed, 2 skipped, 1 warning in 9.81s", True),  # -q
    ("===== 62 passed, 3 skipped in 9.81s =====", False),  # a GPU test that went unseen
    ("===== 63 passed, 1 failed, 1 skipped in 9.81s =====", False),
    ("===== 63 passed, 1 error in 9.81s =====", False),
    ("1 passed, 64 deselected in 2.00s\n1 passed, 64 deselected in 2.01s", True),  # one line per rank
    ("1 passed, 64 deselected in 2.00s\n1 skipped, 64 deselected in 2.01s", False),
    ("Traceback (most recent call last): ...", False),  # no closing line at all
])
def test_a_pytest_step_passes_only_when_enough_of_its_tests_ran(output, ok):
    expect = device.Expect(63, 2) if "63" in output else device.Expect(1, 0)
    assert device.Expect(63, 2).verdict("")[0] is False
    assert expect.verdict(output)[0] is ok


def _dry_summary(**overrides):
    lines = []
    for step in device.STEPS:
        dry = ("SKIP", f"{device.NO_GPU} (ran dry)") if step.gpu else ("PASS", "ok")
        verdict, detail = overrides.get(step.name, dry)
        lines.append(device.summary_line(step.name, verdict, 1.0, detail))
    return "\n".join(lines) + "\ndevice run: ...\n"


def test_a_dry_run_must_skip_the_gpu_steps_for_want_of_a_gpu_and_pass_the_others():
    assert device.dry_problems(_dry_summary()) == []
    assert device.dry_problems(_dry_summary(mpi=("FAIL", "exit 1"))) == ["mpi: FAIL exit 1 (a dry run wants PASS)"]
    assert device.dry_problems(_dry_summary(nccl=("SKIP", "timed out"))) == [
        "nccl: SKIP timed out (a dry run wants SKIP)"]
    assert device.dry_problems(_dry_summary().replace("info ", "infx ", 1))[0] == "the steps are not STEPS, in order"


@pytest.mark.skipif(_launch.outer_world_size() > 1, reason="serial test that starts mpiexec itself")
@pytest.mark.skipif(device.gpu_count() > 0, reason="a GPU is here: tests/gpu/device_run.sh runs these steps for real")
def test_the_gpu_steps_run_dry_here(tmp_path):
    if _launch.mpiexec() is None:
        pytest.skip("no mpiexec here")
    env = _launch.fresh_env(MPIEXEC=_launch.mpiexec())
    proc = subprocess.run([sys.executable, os.path.join("tests", "gpu", "device_steps.py"), "--out", str(tmp_path),
                           "--only", ",".join(GPU_TESTS)], cwd=_launch.ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [device.SUMMARY_LINE.match(line) for line in proc.stdout.splitlines()]
    assert [m["step"] for m in lines if m] == GPU_TESTS
    assert all(m["verdict"] == "SKIP" and m["detail"].startswith(f"{device.NO_GPU} (ran dry") for m in lines if m)
    assert sorted(os.listdir(tmp_path)) == ["logs.tar.gz", "summary.txt"]


def test_without_any_mpi_launcher_the_tests_say_so(monkeypatch):
    monkeypatch.setattr(_launch, "mpiexec", lambda: None)  # the GPU machine before the carried MPICH is in
    with pytest.raises(RuntimeError, match="no MPI launcher"):
        _launch.mpiexec_command(2)
