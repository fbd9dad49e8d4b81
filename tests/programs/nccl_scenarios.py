"""GPU scenarios that need a process of their own (they change its environment, break its CUDA
context or end it), run as one-rank jobs by tests/gpu/test_nccl_gpu.py:

    python tests/programs/nccl_scenarios.py <scenario>

Each prints ``<scenario> ok`` (with what it saw) when everything it checks held.
"""
import os
import sys
import threading
import time

import cupy
import numpy as np

import hpc_c10d as dist
from hpc_c10d.errors import DistBackendError


def _start():
    dist.init_process_group()
    return dist.nccl.bind_local_device()


def exit_without_destroy():
    """Queued GPU work and no destroy_process_group(): the exit hook closes NCCL, with a warning."""
    _start()
    x = cupy.ones(1 << 22, dtype=cupy.float32)
    for _ in range(20):
        dist.all_reduce(x, async_op=True)
    print("exit_without_destroy ok", flush=True)


def nonblocking_environment():
    """NCCL_COMM_BLOCKING=0 makes every NCCL call return ncclInProgress: init, split, a single
    call and a group must all be waited out."""
    assert os.environ.get("NCCL_COMM_BLOCKING") == "0"
    dist.init_process_group(device_id=0)  # a one-rank job on GPU 0: the communicator at once
    sub = dist.new_group(list(range(dist.get_world_size())))  # split from the world's
    size = dist.get_world_size()
    x = cupy.ones(1 << 16, dtype=cupy.float32)
    dist.all_reduce(x)
    dist.all_reduce(x, group=sub)
    got, me = cupy.zeros(8, dtype=cupy.float32), dist.get_rank()
    ops = [dist.P2POp(dist.isend, cupy.full(8, 3, dtype=cupy.float32), me), dist.P2POp(dist.irecv, got, me)]
    for work in dist.batch_isend_irecv(ops):  # one NCCL group: ncclGroupEnd answers "in progress"
        work.wait()
    dist.all_reduce(x, async_op=True).wait(timeout=60)
    cupy.cuda.get_current_stream().synchronize()
    assert float(x[0]) == size ** 3, float(x[0])
    assert float(got[0]) == 3
    dist.destroy_process_group()
    print("nonblocking_environment ok", flush=True)


def sticky_cuda_error():
    """A kernel faults after an operation was queued: its Work fails with the CUDA error instead
    of counting as running for ever."""
    _start()
    world = dist.group.WORLD
    x = cupy.ones(4, dtype=cupy.float32)
    dist.all_reduce(x)  # the communicator exists before the fault: NCCL's init must not be what meets it
    cupy.cuda.get_current_stream().synchronize()
    poke = cupy.RawKernel(r"""extern "C" __global__ void poke(int* p, long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) {}
        *p = 1;
    }""", "poke")
    poke((1,), (1,), (np.uint64(16), np.int64(2_000_000_000)))  # ~1 s, then a write to address 16: sticky
    work = dist.all_reduce(x, async_op=True)  # queued before the fault, ordered after the kernel
    deadline, error = time.monotonic() + 30, None
    while error is None and time.monotonic() < deadline:
        try:
            work.is_completed()
        except DistBackendError as exc:
            error = exc
        time.sleep(0.01)
    assert error is not None and "illegal" in str(error).lower(), error
    assert world._transports["cuda"]._overdue(0.0) is None  # finished (failed), not overdue
    print("sticky_cuda_error ok:", error, flush=True)
    sys.stdout.flush()
    os._exit(0)  # the CUDA context is gone: nothing more to tear down


def abort_from_another_thread():
    """The watchdog's abort, from its own thread, while this one enqueues: every call either
    runs or is refused, never touches a freed communicator."""
    _start()
    group = dist.new_group([0])
    x = cupy.ones(256, dtype=cupy.float32)
    dist.all_reduce(x, group=group)
    backend = group._transports["cuda"]
    aborter = threading.Timer(0.05, backend.abort)
    aborter.start()
    ran = refused = 0
    deadline = time.monotonic() + 30
    while not refused and time.monotonic() < deadline:
        try:
            dist.all_reduce(x, group=group, async_op=True)
            ran += 1
        except DistBackendError as exc:
            assert "aborted" in str(exc), exc
            refused += 1
    aborter.join()
    backend.abort()  # a second abort changes nothing
    y = cupy.ones(4, dtype=cupy.float32)
    fresh = dist.new_group([0])
    dist.all_reduce(y, group=fresh)
    assert refused == 1 and float(y[0]) == 1.0
    dist.destroy_process_group()
    print(f"abort_from_another_thread ok: {ran} ran before the abort", flush=True)


if __name__ == "__main__":
    {f.__name__: f for f in (exit_without_destroy, nonblocking_environment, sticky_cuda_error,
                             abort_from_another_thread)}[sys.argv[1]]()
