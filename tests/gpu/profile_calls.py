#!/usr/bin/env python3
"""Where the host time of a GPU call goes, at one rank: each path timed alone, then under cProfile.

    mpiexec -n 1 python tests/gpu/profile_calls.py [CALLS]    # a device_steps.py step

Paths: ``hpc_c10d.all_reduce`` on an 8-byte cupy array and torch tensor, torch's ``all_reduce`` on
backend "hpc" (the plugin) and on torch's own "nccl", and a DDP step (the bench's 100M bf16 MLP)
on each backend. The bench (``python -m hpc_c10d bench``) gives the numbers; this gives the
breakdown behind them: for each Python path, the functions that spend the most time of their own;
for DDP also the step under a short GIL switch interval and torch.profiler's per-op table.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys

from probes import gpu_or_exit  # beside this file

from hpc_c10d.bench import timing


def _per_call_us(call, calls: int, sync) -> float:
    timing.batch(call, 50, sync)  # warm-up
    return timing.batch(call, calls, sync) * 1e6


def _profile(title: str, call, calls: int, sync, top: int = 18) -> None:
    alone = _per_call_us(call, calls, sync)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    sync()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    body = text.getvalue()
    print(f"\n## {title}: {alone:.1f} us per call alone ({calls} calls)\n{body[body.find('ncalls'):]}", flush=True)


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    gpu_or_exit()
    import cupy
    import torch

    import hpc_c10d as dist
    from hpc_c10d.bench import torch_plugin, training

    dist.init_process_group()
    tdist, native = torch_plugin.start("nccl")
    device = torch.device("cuda", dist.nccl.bind_local_device())
    sync = torch.cuda.synchronize
    x = cupy.ones(2, dtype=cupy.float32)
    t = torch.ones(2, device=device)
    _profile("hpc_c10d.all_reduce, cupy 8 B", lambda: dist.all_reduce(x), calls, sync)
    _profile("hpc_c10d.all_reduce, torch 8 B", lambda: dist.all_reduce(t), calls, sync)
    _profile("torch all_reduce on 'hpc' (the plugin), 8 B", lambda: tdist.all_reduce(t), calls, sync)
    native_us = _per_call_us(lambda: tdist.all_reduce(t, group=native), calls, sync)
    print(f"\n## torch all_reduce on 'nccl', 8 B: {native_us:.1f} us per call alone", flush=True)

    width = training._width(100_000_000)
    inp = torch.randn(64, width, device=device, dtype=torch.bfloat16)
    out = torch.randn(64, width, device=device, dtype=torch.bfloat16)
    for name, group in (("hpc", tdist.group.WORLD), ("nccl", native)):
        model = training._distributed("ddp", torch, training._mlp(torch, width, torch.bfloat16, device), group, device)
        step = torch_plugin.step_of(torch, model, inp, out)
        _profile(f"DDP step on '{name}' (100M bf16)", step, 30, sync, top=25)
        _ddp_timeline(torch, name, step, sync)
    tdist.destroy_process_group()
    dist.destroy_process_group()


def _ddp_timeline(torch, name: str, step, sync) -> None:
    """The step again with a short GIL switch interval (DDP's reducer calls the plugin from the
    autograd thread), then torch.profiler's tables of three steps: CPU and CUDA time per op."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    fast_switch = _per_call_us(step, 30, sync)
    sys.setswitchinterval(interval)
    print(f"\n## DDP step on '{name}' with a 10 us GIL switch interval: {fast_switch:.1f} us per call", flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        sync()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15), flush=True)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15), flush=True)


if __name__ == "__main__":
    main()
