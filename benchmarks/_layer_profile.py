"""Profiles of the embedding layer benchmark's steps (``bench_embedding_layer.py``
``--profile``, ``--trace``, ``--host-profile``): kernels by device time, every kernel
of a call with the device's busy time against its span, the device copies and the
kernels by the host operators that issued them, and the host's own time per function.
"""

from __future__ import annotations

import torch


def _profiled(step, steps: int):
    """A torch profile (host and device, with input shapes) of ``step(i)`` for i in
    range(``steps``), the device synced before and after."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=True) as prof:
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()
    return prof


def profile_steps(step, steps: int, out: str | None) -> None:
    """Kernels and operators of ``steps`` layer steps by device self time (printed, and
    with ``out`` OUT, written to OUT_profile.txt)."""
    prof = _profiled(step, steps)
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40,
                                      max_name_column_width=70) + \
        "\n\nBy operator and input shapes:\n" + \
        prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=40,
            max_shapes_column_width=120)
    table += "\n\nKernels by the operators that launched them (us per step):\n" + \
        _kernel_owners(prof, steps)
    text = f"Layer steps (forward + backward, SGD), {steps} steps, per-kernel device time\n\n"
    print(text + table, flush=True)
    if out:
        with open(f"{out}_profile.txt", "w") as f:
            f.write(text + table + "\n")


def trace_calls(step, steps: int, out: str | None, label: str = "", what: str = "") -> None:
    """Every kernel of ``steps`` calls of ``step`` (us and launches per call), and the
    device's busy time (the union of kernel spans) against the span from the first
    kernel to the last, per call: what the device waits for between kernels (printed,
    and written to OUT_trace.txt, with a ``label`` to OUT_LABEL_trace.txt; ``what``
    says what the batches are)."""
    prof = _profiled(step, steps)
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    kernels: dict[str, list[float]] = {}
    busy, reach = 0.0, None
    for start, end, name in spans:
        kernels.setdefault(name[:90], []).append(end - start)
        if reach is None or start >= reach:
            busy += end - start
        elif end > reach:
            busy += end - reach
        reach = end if reach is None else max(reach, end)
    span = spans[-1][1] - spans[0][0] if spans else 0.0
    text = (f"Layer forward with the next deduplication ahead{what}, {steps} calls: per call "
            f"{busy / steps:.1f} us of kernels over a span of {span / steps:.1f} us "
            f"(profiled, so the host's issue is slower than unprofiled)\n\n"
            f"{'us/call':>9} {'launches':>9}  kernel\n")
    for name, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
        text += f"{sum(times) / steps:9.1f} {len(times) / steps:9.1f}  {name}\n"
    text += _copy_owners(prof, steps)
    print(text, flush=True)
    if out:
        with open(f"{out}_{label + '_' if label else ''}trace.txt", "w") as f:
            f.write(text)


def _copy_owners(prof, steps: int) -> str:
    """The device copies by the host operator that issued them (with its parent and
    input shapes): us and copies per call."""
    owners: dict[tuple, list[float]] = {}
    for event in prof.events():
        for kernel in getattr(event, "kernels", []):
            if kernel.name.startswith("Memcpy"):
                parent = event.cpu_parent.name if event.cpu_parent is not None else "-"
                owner = (kernel.name, f"{parent} > {event.name}", str(event.input_shapes)[:70])
                owners.setdefault(owner, []).append(kernel.duration)
    text = f"\nDevice copies by the operator that issued them\n\n{'us/call':>9} {'copies':>9}  " \
           "copy, operator, input shapes\n"
    for (name, op, shapes), times in sorted(owners.items(), key=lambda kv: -sum(kv[1])):
        text += f"{sum(times) / steps:9.1f} {len(times) / steps:9.1f}  {name}, {op}, {shapes}\n"
    return text


def host_profile(forward, inputs, out: str | None) -> None:
    """The layer's forward calls under cProfile, the device synced after each (outside
    the profile): the host's own time per function, and where it waits on the device."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    for kjt in inputs:
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        prof.enable()
        forward(kjt)
        prof.disable()
    text = f"Host profile of {len(inputs)} layer forward calls (cProfile)\n"
    for order in ("tottime", "cumulative"):
        stats = io.StringIO()
        pstats.Stats(prof, stream=stats).sort_stats(order).print_stats(45)
        text += f"\n== by {order}\n" + stats.getvalue()
    print(text, flush=True)
    if out:
        with open(f"{out}_host_profile.txt", "w") as f:
            f.write(text)


def _kernel_owners(prof, steps: int, top: int = 30) -> str:
    """The kernels of a profile summed per (kernel, launching operator and its callers)."""
    owners: dict[tuple[str, str], float] = {}
    for event in prof.events():
        for kernel in getattr(event, "kernels", []):
            chain, parent = [event.name], event.cpu_parent
            while parent is not None and len(chain) < 4:
                chain.append(parent.name)
                parent = parent.cpu_parent
            key = (kernel.name[:70], " < ".join(chain))
            owners[key] = owners.get(key, 0.0) + kernel.duration
    ranked = sorted(owners.items(), key=lambda item: -item[1])[:top]
    return "\n".join(f"{us / steps:9.1f}  {name}  <=  {chain}" for (name, chain), us in ranked)
