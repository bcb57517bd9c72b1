"""CollectionSchedule: automatic collection off while training, young generations every
N steps, everything at epoch ends, automatic again around checkpoints; state restored."""

from __future__ import annotations

import gc

import pytest

from hashrec.train.collection_schedule import FULL_EVERY, CollectionSchedule


@pytest.fixture
def collects(monkeypatch):
    calls = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or real(*args))
    return calls


@pytest.mark.parametrize("enabled_before", [True, False], ids=["gc_on", "gc_off"])
def test_schedule_switches_collection_and_restores_it(collects, enabled_before):
    (gc.enable if enabled_before else gc.disable)()
    try:
        schedule = CollectionSchedule(every=3)
        schedule.step(3)  # not entered: nothing happens
        assert collects == []
        with schedule:
            assert not gc.isenabled() and gc.get_freeze_count() > 0
            for step in range(1, 8):
                schedule.step(step)
            assert collects == [(), (1,), (1,)]  # entry, then steps 3 and 6
            schedule.step(3 * FULL_EVERY)
            assert collects[-1] == ()  # every FULL_EVERY-th collection is full
            with schedule.automatic():
                assert gc.isenabled() is enabled_before
            assert not gc.isenabled() and collects[-1] == ()
            schedule.full()
            assert collects[-1] == ()
        assert gc.isenabled() is enabled_before and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_every_must_be_positive():
    with pytest.raises(ValueError, match="every"):
        CollectionSchedule(every=0)
