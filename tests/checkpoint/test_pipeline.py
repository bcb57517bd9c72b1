import threading

import pytest

from hashrec.checkpoint.pipeline import WriteBehind, read_ahead


def test_read_ahead_yields_every_item_in_order():
    assert list(read_ahead(iter(range(50)), depth=2)) == list(range(50))


def test_read_ahead_raises_the_producers_error_after_earlier_items():
    def items():
        yield 1
        yield 2
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in read_ahead(items()):
            got.append(item)
    assert got == [1, 2]


def test_read_ahead_stops_the_producer_when_closed_early():
    produced = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    stream = read_ahead(items(), depth=1)
    assert next(stream) == 0
    stream.close()
    count = len(produced)
    assert count < 10
    assert not [t for t in threading.enumerate() if t.name == "checkpoint-read-ahead"]


def test_read_ahead_rejects_zero_depth():
    with pytest.raises(ValueError, match="depth"):
        list(read_ahead([], depth=0))


def test_write_behind_runs_jobs_in_order():
    done = []
    behind = WriteBehind(depth=2)
    for i in range(20):
        behind.submit(lambda i=i: done.append(i))
    behind.finish()
    assert done == list(range(20))


def test_write_behind_raises_a_failed_job_and_skips_later_ones():
    done = []
    behind = WriteBehind()

    def fail():
        raise OSError("no space left")

    behind.submit(fail)
    behind.submit(lambda: done.append(1))
    with pytest.raises(OSError, match="no space"):
        behind.finish()
    assert done == []
    with pytest.raises(OSError, match="no space"):
        behind.submit(lambda: done.append(2))


def test_write_behind_finish_can_ignore_the_error():
    behind = WriteBehind()
    behind.submit(lambda: 1 / 0)
    behind.finish(raise_error=False)
