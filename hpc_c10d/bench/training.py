"""Training steps on backend "hpc" against torch's own backend (gloo, or NCCL on a GPU) over the same
ranks: a DDP step and an FSDP2 (``fully_shard``) step of one MLP, timed in interleaved rounds, with
each backend's peak GPU memory.

A checking pass first takes one step on each backend from the same weights and data, and counts
the parameters that then differ between them (the wrong count).
"""

from __future__ import annotations

from typing import Any

from .report import Record
from .sweep import Sweep
from .torch_plugin import PLUGIN, step_of

__all__ = ["run", "STRATEGIES", "NATIVE"]

STRATEGIES = ("ddp", "fsdp2")
NATIVE = "torch"  # torch's own backend, in the tables
_LAYERS = 6


def _width(params: int) -> int:
    """The hidden width that gives about ``params`` parameters over the MLP's square layers."""
    return max(8, int((params / _LAYERS) ** 0.5))


def _mlp(torch: Any, width: int, dtype: Any, device: Any) -> Any:
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(_LAYERS):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]).to(device=device, dtype=dtype)


def _distributed(strategy: str, torch: Any, model: Any, group: Any, device: Any) -> Any:
    """``model`` under DDP or FSDP2 on ``group``."""
    if strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, process_group=group, device_ids=ids)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, device.type)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _flat_parameters(torch: Any, model: Any) -> Any:
    """Every parameter, whole (FSDP2's shards gathered), as one float64 vector on the CPU."""
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return torch.cat([p.detach().double().reshape(-1).cpu() for p in whole])


def run(bench: Sweep, tdist: Any, native: Any, params: int, dtype_name: str, batch: int,
        strategies: list[str]) -> list[Record]:
    """Each of ``strategies`` on the plugin's default group and on ``native``: check, then time."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if bench.device == "cuda" else torch.device("cpu")
    dtype = getattr(torch, dtype_name)
    width = _width(params)
    gen = torch.Generator().manual_seed(1 + bench.rank)
    x = torch.randn(batch, width, generator=gen).to(device=device, dtype=dtype)
    y = torch.randn(batch, width, generator=gen).to(device=device, dtype=dtype)
    groups = {PLUGIN: tdist.group.WORLD, NATIVE: native}
    records = []
    bench.progress.total = len(strategies)
    bench.batch_s, bench.max_iters = max(bench.batch_s, 0.05), min(bench.max_iters, 200)  # steps take milliseconds
    for strategy in strategies:
        models = {impl: _distributed(strategy, torch, _mlp(torch, width, dtype, device), group, device)
                  for impl, group in groups.items()}
        steps = {impl: step_of(torch, model, x, y) for impl, model in models.items()}
        for step in steps.values():
            step()
        first, second = (_flat_parameters(torch, model) for model in models.values())
        tolerance = 1e-2 if dtype.itemsize == 2 else 1e-5
        wrong = int((~torch.isclose(first, second, rtol=tolerance, atol=tolerance)).sum())
        measured = bench.measure(steps)
        peaks = _peak_memory(torch, steps) if device.type == "cuda" else {}
        count = sum(p.numel() for p in _mlp(torch, width, dtype, "meta").parameters())
        point = bench.records(measured, {impl: wrong for impl in steps}, bench="training",
                              op=f"{strategy} step ({count / 1e6:.1f}M parameters, batch {batch})",
                              bytes=count * dtype.itemsize, count=count, dtype=dtype_name)
        for record in point:
            if record.impl in peaks:
                record.note = f"a step's peak GPU memory above what was allocated {peaks[record.impl] / 2**20:.0f} MiB"
        records += point
        bench.progress.step(strategy)
    return records


def _peak_memory(torch: Any, steps: dict[str, Any]) -> dict[str, int]:
    """What each step needs beyond the memory already allocated (both models, their optimiser
    state): the peak over two more steps of its own, in bytes."""
    peaks = {}
    for impl, step in steps.items():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        resident = torch.cuda.memory_allocated()
        step()
        step()
        torch.cuda.synchronize()
        peaks[impl] = torch.cuda.max_memory_allocated() - resident
    return peaks
