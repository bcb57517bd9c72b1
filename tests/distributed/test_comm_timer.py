"""CommTimer: regions add up, drains reset, a disabled timer records nothing; on CUDA the
event pairs are reused after a drain."""

import time

import pytest
import torch

from hashrec.distributed.comm_timer import CommTimer


def test_regions_add_up_and_drain_resets():
    timer = CommTimer("cpu")
    for _ in range(3):
        with timer.region():
            time.sleep(0.01)
    seconds, regions = timer.drain()
    assert regions == 3 and seconds >= 0.03
    assert timer.drain() == (0.0, 0)


def test_disabled_timer_records_nothing():
    timer = CommTimer("cpu", enabled=False)
    with timer.region():
        time.sleep(0.001)
    assert timer.drain() == (0.0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_event_pairs_are_reused_after_a_drain():
    timer = CommTimer("cuda")
    x = torch.ones(1 << 20, device="cuda")
    for _ in range(2):
        with timer.region():
            x.mul_(1.0)
    first = list(timer._events)
    seconds, regions = timer.drain()
    assert regions == 2 and seconds > 0
    with timer.region():
        x.mul_(1.0)
    assert timer._events[0] in first
