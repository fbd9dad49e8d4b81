#!/usr/bin/env python3
"""Every check of the GPU half, one step at a time, each under its own time limit.

tests/gpu/device_run.sh runs this after installing the carried wheels. On a machine without a
GPU (the dry run) the steps that need one still run, as far as they can: each must stop cleanly
(its tests skip, its program refuses without a traceback) and then ends SKIP "no CUDA GPU";
every other step must pass. On a GPU machine a GPU step whose tests skip (no CuPy, no NCCL, a
GPU that went unseen) fails: each pytest step says how many of its tests must run.

    python tests/gpu/device_steps.py --out DIR [--part check|speed|bench|all] [--only STEP,...] [--list]

Parts: "check" (correctness), "speed" (the per-op bench of every implementation, the plugin's
included, and the training rounds: what one call measures before a change and another after;
their time limits fit the budget together), "bench" (every number: speed's steps, then the rest),
"all". After a ``--part speed`` run, ``python tests/gpu/gpu_report.py DIR`` here makes the report.

Under DIR: ``summary.txt`` (one line per step, ``STEP VERDICT SECONDS s DETAIL``, then a count),
``logs.tar.gz`` (every step's log) and what the benchmark steps write: their JSON, the plot, and
``benchmarks-gpu.md`` and ``targets-gpu.md`` (tests/gpu/gpu_report.py): docs/benchmarks.md's GPU
section and the targets for docs/dev/measurements.md. The whole run stops
starting steps once its budget (``--budget``) is spent; those steps end FAIL "not run".
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBES = os.path.join("tests", "gpu", "probes.py")
NO_GPU = "no CUDA GPU"
BUDGET_S = 420.0
VERDICTS = ("PASS", "FAIL", "SKIP")
SUMMARY_LINE = re.compile(r"^(?P<step>[a-z0-9-]+) +(?P<verdict>PASS|FAIL|SKIP) +(?P<seconds>\d+\.\d)s +(?P<detail>.*)$")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # pytest colours its lines where a launcher gives it a terminal


def _plain(text: str) -> str:
    return _COLOUR.sub("", text)


# pytest's closing line, "=== 63 passed, 2 skipped in 9.81s ===" (bare under -q)
# Two ranks may print theirs on one line ("1 skipped in 0.54s1 skipped in 0.26s"): a count may
# also start right after another's "s", and end where the next begins
_PYTEST_COUNTS = re.compile(r"(?:^|(?<=\ds))(?:=+ )?(?P<counts>\d+ [a-z]+(?:, \d+ [a-z]+)*) in [\d.]+s(?=\d|\W|$)",
                            re.M)


@dataclass(frozen=True)
class Expect:
    """What a pytest step's summary line must show: at least ``passed`` passed, at most ``skipped``
    skipped, nothing failed (each rank's line, when several ranks print one)."""

    passed: int
    skipped: int = 0

    def verdict(self, output: str) -> tuple[bool, str]:
        lines = [m.group("counts") for m in _PYTEST_COUNTS.finditer(_plain(output))]
        if not lines:
            return False, "no pytest summary line"
        for line in lines:
            counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed)", line)}
            bad = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
            if bad or counts.get("passed", 0) < self.passed or counts.get("skipped", 0) > self.skipped:
                return False, f"{line} (needs >= {self.passed} passed, <= {self.skipped} skipped, none failed)"
        return True, lines[-1]


@dataclass(frozen=True)
class Step:
    """One check: a command (``{mpiexec}``, ``{python}``, ``{out}`` are filled in), its part
    ("check": correctness, "speed": the numbers a speed change is judged on, "bench": the other
    numbers), whether it needs a GPU, its time limit."""

    name: str
    part: str
    gpu: bool
    timeout_s: int
    argv: tuple[str, ...]
    expect: Optional[Expect] = None


def _pytest(*args: str) -> tuple[str, ...]:
    return ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no", "-rs", "--with-mpi", "-m", "mpi",
            *args)


def _mpi(n: int, *argv: str) -> tuple[str, ...]:
    return ("{mpiexec}", "-n", str(n), *argv)


COMPARED = "nccl,torch,plugin,hpc_c10d-tensors"  # beside hpc_c10d on cupy arrays


def _bench(*args: str) -> tuple[str, ...]:
    return _mpi(1, "{python}", "-m", "hpc_c10d", "bench", *args)


STEPS = (
    Step("environment", "check", False, 60, ("{python}", PROBES, "environment")),
    Step("mpi", "check", False, 60, _mpi(2, "{python}", PROBES, "mpi")),
    Step("info", "check", False, 60, _mpi(1, "{python}", "-m", "hpc_c10d", "info")),
    Step("cupy", "check", True, 60, ("{python}", PROBES, "cupy")),
    Step("nccl", "check", True, 90, _mpi(1, "{python}", PROBES, "nccl")),
    # 66 tests: at one rank only the ring (two ranks) and the shared-GPU refusal skip
    Step("nccl-gpu-tests", "check", True, 240, _mpi(1, *_pytest("tests/gpu/test_nccl_gpu.py")), Expect(64, 2)),
    Step("one-gpu-two-ranks", "check", True, 120,
         _mpi(2, *_pytest("tests/gpu/test_nccl_gpu.py", "-k", "two_ranks_on_one_gpu")), Expect(1, 0)),
    Step("torch-path", "check", True, 90, _mpi(1, "{python}", PROBES, "torch_path")),
    Step("torch-cuda-tests", "check", True, 180, _mpi(1, *_pytest("tests/gpu/test_torch_cuda.py")), Expect(13, 0)),
    # the same tests on hpc_c10d's own NCCL transport, which HPC_C10D_TORCH_CUDA=hpc chooses
    Step("torch-cuda-tests-hpc", "check", True, 180,
         ("env", "HPC_C10D_TORCH_CUDA=hpc", *_mpi(1, *_pytest("tests/gpu/test_torch_cuda.py"))), Expect(13, 0)),
    Step("checkpoint-gpu", "check", True, 90, _mpi(1, *_pytest("tests/tools/test_checkpoint.py", "-k", "gpu_arrays")),
         Expect(1, 0)),
    Step("gpus-md-snippet", "check", True, 90, _mpi(1, "{python}", PROBES, "gpus_md")),
    Step("bench-smoke", "check", True, 120,
         _bench("collectives", "--device", "cuda", "--ops", "all_reduce,all_gather,reduce_scatter", "-b", "8:1M",
                "-f", "32", "--compare", "nccl,torch")),
    Step("bench-collectives", "speed", True, 240,
         _bench("collectives", "--device", "cuda", "--ops", "all_reduce,broadcast,all_gather,reduce_scatter,all_to_all",
                "-b", "8:1G", "-f", "32", "-r", "5", "--compare", COMPARED, "--json", "{out}/bench-gpu.json",
                "--plot", "{out}/bench-gpu.png")),
    # 3 runs of each shape, alternating; one 100M bf16 run took well under 150 s on the H200
    Step("training-rounds", "speed", True, 180,
         ("{python}", os.path.join("tests", "gpu", "training_rounds.py"), "--out", "{out}", "--runs", "3",
          "--mpiexec", "{mpiexec}", "--python", "{python}")),
    Step("bench-collectives-async", "bench", True, 120,
         _bench("collectives", "--device", "cuda", "--ops", "all_reduce", "-a", "-b", "8:1G", "-f", "32", "-r", "5",
                "--compare", COMPARED, "--json", "{out}/bench-gpu-async.json")),
    # one round writes and reads 4 GiB three ways: about 60 s on the H100 machine
    Step("bench-checkpoint", "bench", True, 150,
         _bench("checkpoint", "--device", "cuda", "--size", "4G", "--dir", "{scratch}", "-r", "1", "--compare",
                "torch.save,dcp", "--json", "{out}/bench-checkpoint.json")),
    Step("profile", "bench", True, 120, _mpi(1, "{python}", os.path.join("tests", "gpu", "profile_calls.py"))),
    Step("benchmarks-doc", "bench", False, 60, ("{python}", os.path.join("tests", "gpu", "gpu_report.py"), "{out}")),
)


#: --part → the steps' parts it runs (each part's steps come after the previous part's)
PARTS = {"check": ("check",), "speed": ("speed",), "bench": ("speed", "bench"), "all": ("check", "speed", "bench")}


def steps_of(part: str, only: list[str]) -> list[Step]:
    """The steps of ``part`` (``PARTS``), or those named in ``only``, in order."""
    unknown = sorted(set(only) - {s.name for s in STEPS})
    if unknown:
        raise SystemExit(f"device_steps: no step {', '.join(unknown)}; --list shows them")
    return [s for s in STEPS if (s.name in only if only else s.part in PARTS[part])]


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without the tool or a driver)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in listing.splitlines())


def summary_line(step: str, verdict: str, seconds: float, detail: str) -> str:
    """One summary line (``SUMMARY_LINE`` reads it back)."""
    assert verdict in VERDICTS
    return f"{step:<24} {verdict} {seconds:7.1f}s  {' '.join(detail.split())[:300]}"


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _dry_verdict(step: Step, rc: int, output: str) -> tuple[str, str]:
    """A GPU step run without a GPU: it must stop cleanly (a skip, or a refusal without a Python
    traceback), which shows its command, imports and launch work as far as they can here."""
    output = _plain(output)
    ran = _PYTEST_COUNTS.findall(output)
    failed = any(re.search(r"\d+ (failed|errors?)", counts) for counts in ran)
    if "Traceback (most recent call last)" in output or failed or (step.expect is not None and not ran):
        return "FAIL", f"ran dry without a GPU and broke (exit {rc}): {_last_line(output)}"
    return "SKIP", f"{NO_GPU} (ran dry, exit {rc}: {_last_line(output)})"


def run_step(step: Step, out: str, scratch: str, logs: str, limit_s: float,
             have_gpu: bool) -> tuple[str, float, str]:
    """(verdict, seconds, detail) of one step; its output goes to ``logs/<name>.log``, large files
    to ``scratch`` (``out`` comes back from the device: a few small files only)."""
    if limit_s < 5:
        return "FAIL", 0.0, "not run: the run's time budget was spent"
    fill = {"{python}": sys.executable, "{mpiexec}": os.environ.get("MPIEXEC", "mpiexec")}
    argv = [fill.get(a, a).replace("{out}", out).replace("{scratch}", scratch) for a in step.argv]
    timeout = min(step.timeout_s, int(limit_s))
    start = time.monotonic()
    with open(os.path.join(logs, f"{step.name}.log"), "w") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        try:
            proc = subprocess.run(["timeout", "-k", "10", str(timeout), *argv], cwd=ROOT, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout + 30)
            output, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            output, rc = str(exc.stdout or ""), 124
        log.write(output)
    seconds = time.monotonic() - start
    if step.gpu and not have_gpu:
        verdict, detail = _dry_verdict(step, rc, output)
        return verdict, seconds, detail
    if rc in (124, 137):
        return "FAIL", seconds, f"timed out after {timeout} s: {_last_line(output)}"
    ok, detail = step.expect.verdict(output) if step.expect is not None else (True, _last_line(output))
    return ("PASS" if ok and rc == 0 else "FAIL"), seconds, detail if rc == 0 else f"exit {rc}: {detail}"


def dry_problems(summary: str) -> list[str]:
    """What is wrong with a dry run's summary: every step must be there, in order, the GPU ones
    skipped for want of a GPU and the others passed."""
    lines = [m for m in map(SUMMARY_LINE.match, summary.splitlines()) if m]
    problems = [] if [m["step"] for m in lines] == [s.name for s in STEPS] else ["the steps are not STEPS, in order"]
    gpu = {s.name for s in STEPS if s.gpu}
    for m in lines:
        wanted = ("SKIP", NO_GPU) if m["step"] in gpu else ("PASS", "")
        if m["verdict"] != wanted[0] or not m["detail"].startswith(wanted[1]):
            problems.append(f"{m['step']}: {m['verdict']} {m['detail']} (a dry run wants {wanted[0]})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "device-out"), help="where results go")
    parser.add_argument("--part", choices=tuple(PARTS), default="all")
    parser.add_argument("--only", default="", help="comma list of steps (overrides --part)")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help=f"seconds for the whole run (default {BUDGET_S:g}: a second call fits the device time)")
    parser.add_argument("--list", action="store_true", help="print the steps and exit")
    parser.add_argument("--check-dry", metavar="SUMMARY", help="check a dry run's summary.txt and exit")
    args = parser.parse_args(argv)
    if args.check_dry:
        with open(args.check_dry) as f:
            problems = dry_problems(f.read())
        print("\n".join(problems) or "dry run summary: every GPU step skipped for want of a GPU, every other passed")
        return 1 if problems else 0
    chosen = steps_of(args.part, [s for s in args.only.split(",") if s])
    if args.list:
        for s in chosen:
            print(f"{s.name:<24} {s.part:<5} {'gpu' if s.gpu else 'cpu'} {s.timeout_s:4d}s  {' '.join(s.argv)}")
        return 0
    out = os.path.abspath(args.out)
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    have_gpu = gpu_count() > 0
    deadline = time.monotonic() + args.budget
    lines, verdicts = [], []
    scratch = tempfile.mkdtemp(prefix="hpc-c10d-device-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    try:
        for step in chosen:
            verdict, seconds, detail = run_step(step, out, scratch, logs, deadline - time.monotonic(), have_gpu)
            lines.append(summary_line(step.name, verdict, seconds, detail))
            verdicts.append(verdict)
            print(lines[-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS)
    lines.append(f"device run: {counts} ({'with' if have_gpu else 'without'} a GPU)")
    print(lines[-1], flush=True)
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with tarfile.open(os.path.join(out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(logs, arcname="logs")
    shutil.rmtree(logs)  # the device tool brings back files no more than 2 folders down, 8 at most
    return 1 if "FAIL" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
