"""The GPU device run (tests/gpu/): its step list, its summary format, its verdicts on pytest's
closing lines, and its GPU steps run dry here, where there is no GPU.

The run itself happens on a lent GPU machine; `bash tests/gpu/dry_run.sh` (CI) runs all of it in
a Python 3.12 venv made the way that machine is.
"""
import os
import re
import subprocess
import sys

import pytest

from support import launch
from hpc_c10d.bench.report import Record, write_json

sys.path.insert(0, os.path.join(launch.ROOT, "tests", "gpu"))
import device_steps as device  # noqa: E402
import gpu_report  # noqa: E402
import training_rounds  # noqa: E402

GPU_TESTS = ["nccl-gpu-tests", "one-gpu-two-ranks", "torch-cuda-tests", "torch-cuda-tests-hpc", "checkpoint-gpu"]


def test_every_step_is_named_timed_and_placed():
    names = [s.name for s in device.STEPS]
    assert len(set(names)) == len(names)
    assert all(device.SUMMARY_LINE.match(device.summary_line(n, "PASS", 1.0, "x")) for n in names)
    assert {s.part for s in device.STEPS} == {"check", "speed", "bench"}
    parts = [s.part for s in device.STEPS]
    assert parts == sorted(parts, key=device.PARTS["all"].index)  # the checks first: the budget ends with numbers
    assert all(0 < s.timeout_s <= device.BUDGET_S for s in device.STEPS)
    assert device.BUDGET_S <= 420  # 7 minutes: a second call fits the device time
    speed = device.steps_of("speed", [])
    assert [s.name for s in speed] == ["bench-collectives", "training-rounds"]
    assert sum(s.timeout_s for s in speed) <= device.BUDGET_S  # one call before a change, one after: never cut short
    assert "plugin" in speed[0].argv[speed[0].argv.index("--compare") + 1].split(",")
    assert [s.name for s in device.steps_of("bench", [])] == [s.name for s in device.STEPS if s.part != "check"]
    assert [s.name for s in device.steps_of("all", [])] == [s.name for s in device.STEPS]
    for step in device.STEPS:
        assert step.gpu or step.part == "check" or step.name == "benchmarks-doc"
        if "pytest" in step.argv:  # a GPU pytest step says how many of its tests must run there
            assert step.expect is not None and step.expect.passed > 0
        assert all(os.path.exists(os.path.join(launch.ROOT, a)) for a in step.argv if a.startswith("tests/"))
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
    ("1 passed, 64 deselected in 2.00s1 passed, 64 deselected in 2.01s", True),  # two ranks' lines run together
    ("1 passed, 64 deselected in 2.00s1 skipped, 64 deselected in 2.01s", False),
    ("\x1b[32m\x1b[1m63 passed\x1b[0m, \x1b[33m2 skipped\x1b[0m\x1b[32m in 9.81s\x1b[0m", True),  # coloured
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


@pytest.mark.skipif(launch.outer_world_size() > 1, reason="serial test that starts mpiexec itself")
@pytest.mark.skipif(device.gpu_count() > 0, reason="a GPU is here: tests/gpu/device_run.sh runs these steps for real")
@pytest.mark.long
def test_the_gpu_steps_run_dry_here(tmp_path):
    if launch.mpiexec() is None:
        pytest.skip("no mpiexec here")
    env = launch.fresh_env(MPIEXEC=launch.mpiexec())
    proc = subprocess.run([sys.executable, os.path.join("tests", "gpu", "device_steps.py"), "--out", str(tmp_path),
                           "--only", ",".join(GPU_TESTS)], cwd=launch.ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [device.SUMMARY_LINE.match(line) for line in proc.stdout.splitlines()]
    assert [m["step"] for m in lines if m] == GPU_TESTS
    assert all(m["verdict"] == "SKIP" and m["detail"].startswith(f"{device.NO_GPU} (ran dry") for m in lines if m)
    assert sorted(os.listdir(tmp_path)) == ["logs.tar.gz", "summary.txt"]  # at most 8 files come back


def test_without_any_mpi_launcher_the_tests_say_so(monkeypatch):
    monkeypatch.setattr(launch, "mpiexec", lambda: None)  # the GPU machine before the carried MPICH is in
    with pytest.raises(RuntimeError, match="no MPI launcher"):
        launch.mpiexec_command(2)


META = {"command": "python -m hpc_c10d bench collectives --device cuda", "date": "2026-11-26", "host": "gpu1",
        "gpu": "NVIDIA H100, driver CUDA 13.0, runtime CUDA 13.0, NCCL 2.28.3", "torch": "2.11.0",
        "hpc_c10d": "0.1.0", "ranks": 1}


def _point(bench, op, impl, nbytes, us, host=None, gbs=None):
    return Record(bench=bench, op=op, impl=impl, ranks=1, bytes=nbytes, us_min=us, us_median=us, us_max=us,
                  host_us=host, algbw_gbs=gbs, device="cuda")


def _runs(note, *records):
    for r in records:
        r.note = note
    return list(records)


def test_the_gpu_report_judges_every_target():
    mib = gpu_report.MiB
    three = "median of 3 runs: 1, 2, 3 µs"
    records = [
        _point("collectives", "all_reduce", "hpc_c10d", 8, 7.0, host=6.0),
        _point("collectives", "all_reduce", "nccl", 8, 6.0, host=5.0),  # 1.20: met
        _point("collectives", "all_reduce", "hpc_c10d", mib, 30.0, host=10.3),
        _point("collectives", "all_reduce", "nccl", mib, 30.0, host=10.0),  # 1.03: missed
        _point("collectives", "all_reduce", "torch", 8, 8.0, host=5.0),
        _point("collectives", "all_reduce", "torch", mib, 29.0, host=9.0),  # 30 / 29: slower than torch
        _point("collectives", "all_reduce", "hpc_c10d-tensors", 8, 8.0),
        _point("collectives", "all_reduce", "hpc_c10d-tensors", mib, 28.0),  # 8 / 8 and 28 / 29: never slower
        _point("collectives", "all_reduce", "plugin", 8, 9.0, host=6.5),  # +1.5 µs over torch
        _point("collectives", "all_reduce", "plugin", mib, 30.0, host=10.1),  # +1.1
        _point("collectives", "broadcast", "torch", 8, 8.0, host=5.0),
        _point("collectives", "broadcast", "plugin", 8, 9.0, host=7.5),  # +2.5 µs on another op: missed
        *_runs(three, _point("training", "ddp step", "plugin", 100, 103.0),
               _point("training", "ddp step", "torch", 100, 100.0)),  # 1.03: met
        _point("checkpoint", "write", "hpc_c10d", 4 << 30, 1.0, gbs=1.0),
        _point("checkpoint", "write", "dcp", 4 << 30, 1.0, gbs=1.2),  # 0.83: met
        _point("checkpoint", "read", "hpc_c10d", 4 << 30, 1.0, gbs=0.5),
        _point("checkpoint", "read", "torch.save", 4 << 30, 1.0, gbs=1.0),  # 0.5: missed
    ]
    got = gpu_report.verdicts(records)
    assert [v.met for v in got] == [True, False, False, True, False, True, True, False]
    assert got[4].measured == "worst +2.5 µs (broadcast blocking, 8 B; 3 points)"
    assert got[5].measured.endswith("; 3 runs")
    assert [v.met for v in gpu_report.verdicts([])] == [None] * 8
    table = gpu_report.plugin_table(records)
    assert table[-2:] == ["| all_reduce | 8 B | +1.5 | +1.3 |", "| broadcast | 8 B | +2.5 | +2.5 |"]
    assert gpu_report.plugin_table(records[:8]) == []  # no plugin: no table


@pytest.mark.parametrize("plugin_us, note, met", [
    (103.1, "median of 3 runs: 1, 2, 3 µs", False),  # over 1.03x
    (90.0, "median of 5 runs: 1, 2, 3, 4, 5 µs", True),
    (90.0, "median of 2 runs: 1, 2 µs", None),  # fewer runs than the target asks for: not measured
    (90.0, "", None),  # one run of the bench itself
])
def test_the_training_target_is_the_median_of_three_runs_within_3_percent(plugin_us, note, met):
    records = _runs(note, _point("training", "fsdp2 step", "plugin", 100, plugin_us),
                    _point("training", "fsdp2 step", "torch", 100, 100.0))
    assert [v.met for v in gpu_report.verdicts(records) if v.target.startswith("training")] == [met]


BIG, SMALL = "ddp step (100.0M parameters, batch 64)", "ddp step (6.0M parameters, batch 256)"


def _training_run(path, op, dtype, plugin_us, torch_us, wrong):
    """One run of the training bench, written as the bench writes it, read back as gpu_report reads it."""
    records = [_point("training", op, impl, 8, us, host=us - 10) for impl, us in (("plugin", plugin_us),
                                                                                 ("torch", torch_us))]
    for r in records:
        r.dtype, r.wrong = dtype, wrong
    write_json(str(path), META, records)
    return gpu_report.load(str(path))


def test_training_rounds_write_the_median_of_their_runs_in_the_bench_format(tmp_path):
    runs = []
    for n, (big, small) in enumerate([(3300.0, 900.0), (3100.0, 950.0), (3200.0, 800.0)]):  # alternating shapes
        runs.append(_training_run(tmp_path / f"big{n}.json", BIG, "bfloat16", big, big / 2, wrong=n))
        runs.append(_training_run(tmp_path / f"small{n}.json", SMALL, "float32", small, small / 2, wrong=None))
    training_rounds.write(str(tmp_path / training_rounds.OUTPUT), runs)
    meta, merged = gpu_report.load(str(tmp_path / "bench-training.json"))
    assert meta["gpu"] == META["gpu"] and "--params 6M -d float32 --batch 256" in meta["command"]
    got = {(r.op, r.impl): r for r in merged}
    assert list(got) == [(BIG, "plugin"), (BIG, "torch"), (SMALL, "plugin"), (SMALL, "torch")]
    big = got[BIG, "plugin"]
    assert (big.us_min, big.us_median, big.us_max, big.host_us, big.gpu_us) == (3200.0, 3200.0, 3200.0, 3190.0, None)
    assert big.note == "median of 3 runs: 3300.0, 3100.0, 3200.0 µs" and big.wrong == 2 and big.dtype == "bfloat16"
    assert got[SMALL, "torch"].us_max == 450.0 and got[SMALL, "torch"].wrong is None
    verdict = [v for v in gpu_report.verdicts(merged) if v.target.startswith("training")][0]
    assert verdict.met is False and verdict.measured.endswith("; 3 runs")  # 2x torch; the runs read from the notes


@pytest.mark.skipif(device.gpu_count() > 0, reason="a GPU is here: the device run runs the rounds for real")
def test_training_rounds_stop_cleanly_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join("tests", "gpu", "training_rounds.py"), "--out", str(tmp_path)],
                          cwd=launch.ROOT, env=launch.fresh_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout.startswith(device.NO_GPU), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and os.listdir(tmp_path) == []


def test_the_gpu_report_is_made_from_the_runs_json(tmp_path):
    assert all("No GPU benchmark ran" in text for text in gpu_report.report(str(tmp_path)))
    write_json(str(tmp_path / "bench-gpu.json"), META, [_point("collectives", "all_reduce", "hpc_c10d", 8, 7.0, 6.0),
                                                       _point("collectives", "all_reduce", "nccl", 8, 6.0, 5.0),
                                                       _point("collectives", "all_reduce", "torch", 8, 9.0, 8.0),
                                                       _point("collectives", "all_reduce", "plugin", 8, 9.5, 8.5)])
    page, record = gpu_report.report(str(tmp_path))
    measured = re.search(r"^Measured on (\S+), (.*): `python -m hpc_c10d bench collectives --device cuda`$", page, re.M)
    assert measured and "NVIDIA H100, driver CUDA 13.0" in measured[2] and "### collectives: all_reduce" in page
    assert measured[1] == META["date"][:10] and "| target |" not in page  # a user page: no targets
    assert "| host time per call <= 1.2x" in record and "| all_reduce | 8 B | +0.5 | +0.5 |" in record
    assert "over torch's 'nccl'\n\n| op | worst size |" in record


def test_the_carried_wheels_cover_every_dependency_the_gpu_machine_lacks():
    """The GPU machine has numpy (and torch, cupy, h5py) but none of our other dependencies may be
    assumed: a new one in pyproject.toml must join tests/gpu/fetch_wheels.sh (the dry run caught
    threadpoolctl missing there)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(os.path.join(launch.ROOT, "pyproject.toml"), "rb") as f:
        needed = {re.split(r"[<>=!~ \[]", r)[0].lower().replace("_", "-")
                  for r in tomllib.load(f)["project"]["dependencies"]} - {"numpy"}
    with open(os.path.join(launch.ROOT, "tests", "gpu", "fetch_wheels.sh")) as f:
        script = f.read()
    carried = {name.lower().replace("_", "-") for name in re.findall(r"([\w.-]+)==", script)}
    assert needed <= carried, sorted(needed - carried)
    assert {"mpich", "pytest-mpi"} <= carried
