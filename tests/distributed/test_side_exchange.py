"""side_exchange: work run aside after the current stream's queue, and streams ordered
after it (GPU only: on the CPU nothing runs aside)."""

import pytest
import torch

from hashrec.distributed import side_exchange

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def test_work_run_aside_follows_the_queue_and_orders_later_replays():
    device = torch.device("cuda", torch.cuda.current_device())
    source = torch.zeros(1 << 20, device=device)
    torch.cuda._sleep(50_000_000)  # the current stream is busy for a while
    source.fill_(3.0)
    aside, event = side_exchange.run_aside(device, lambda: source * 2, (source,))
    # The side work ran after the fill queued before it.
    event.synchronize()
    assert torch.equal(aside, torch.full_like(source, 6.0))

    side = side_exchange._side_stream(device.index)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        late = torch.ones(1, device=device)
        marker = torch.cuda.Event()
        marker.record(side)
    side_exchange._latest[device.index] = marker
    side_exchange.order_after_side(device)
    seen = late + 0  # on the current stream, after the side stream's slow work
    assert seen.item() == 1.0
    side_exchange.settle_side(device)
    assert marker.query()
