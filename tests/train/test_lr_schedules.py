import math

import pytest
from google.protobuf import text_format

from hashrec.config import optimizer_pb2
from hashrec.train.errors import TrainError
from hashrec.train.lr_schedules import (
    ConstantSchedule,
    ExponentialDecaySchedule,
    ManualStepSchedule,
    build_schedule,
)


def test_constant():
    assert [ConstantSchedule(0.1)(s) for s in (0, 5, 10_000)] == [0.1] * 3


def test_exponential_decay_staircase_and_floor():
    sched = ExponentialDecaySchedule(1.0, decay_size=10, decay_factor=0.5, min_learning_rate=0.2)
    assert [sched(s) for s in (0, 9, 10, 19, 20, 30, 1000)] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.2,
                                                                  0.2]


def test_exponential_decay_smooth_with_warmup():
    sched = ExponentialDecaySchedule(1.0, decay_size=10, decay_factor=0.5, staircase=False,
                                     warmup_learning_rate=0.0, warmup_size=4)
    assert sched(0) == 0.0
    assert sched(2) == pytest.approx(0.5)
    assert sched(4) == pytest.approx(1.0)
    assert sched(9) == pytest.approx(0.5 ** 0.5)


def test_exponential_decay_by_epoch_ignores_step():
    sched = ExponentialDecaySchedule(1.0, decay_size=1, decay_factor=0.1, by_epoch=True)
    assert sched(999, epoch=0) == 1.0
    assert sched(0, epoch=2) == pytest.approx(0.01)


def test_manual_step_switches_past_each_boundary():
    # TorchEasyRec's ManualStepLR: learning_rates[i] once t > schedule_sizes[i]
    sched = ManualStepSchedule(1.0, (10, 20), (0.5, 0.1))
    assert [sched(s) for s in (0, 9, 10, 11, 20, 21, 500)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.1,
                                                                 0.1]


def test_manual_step_warmup_goes_from_base_to_the_first_rate():
    sched = ManualStepSchedule(0.1, (4, 8), (0.01, 0.001), warmup=True)
    assert [sched(t) for t in range(10)] == pytest.approx(
        [0.1, 0.0775, 0.055, 0.0325, 0.01, 0.01, 0.01, 0.01, 0.01, 0.001])


@pytest.mark.parametrize("make", [
    lambda: ExponentialDecaySchedule(1.0, decay_size=0),
    lambda: ExponentialDecaySchedule(1.0, decay_size=5, decay_factor=1.5),
    lambda: ManualStepSchedule(1.0, (10,), (0.5, 0.1)),
    lambda: ManualStepSchedule(1.0, (20, 10), (0.5, 0.1)),
], ids=["decay-size", "decay-factor", "unpaired", "unsorted"])
def test_invalid_schedules(make):
    with pytest.raises(ValueError):
        make()


def _dense(text):
    return text_format.Parse(text, optimizer_pb2.DenseOptimizer())


def test_build_from_config():
    sched = build_schedule(_dense(
        "adam_optimizer { lr: 0.1 } exponential_decay_learning_rate { decay_size: 100 "
        "decay_factor: 0.5 }"), 0.1, "x")
    assert math.isclose(sched(250), 0.025, rel_tol=1e-6)
    assert build_schedule(_dense("adam_optimizer { lr: 0.1 }"), 0.1, "x")(5) == 0.1
    manual = build_schedule(_dense(
        "sgd_optimizer { lr: 1.0 } manual_step_learning_rate { schedule_sizes: [3] "
        "learning_rates: [0.5] }"), 1.0, "x")
    assert manual(3) == 1.0 and manual(4) == 0.5


def test_build_error_names_where():
    with pytest.raises(TrainError, match="train_config.dense_optimizer.*decay_size"):
        build_schedule(_dense("adam_optimizer { lr: 0.1 } exponential_decay_learning_rate {}"),
                       0.1, "train_config.dense_optimizer")


def test_a_zero_base_rate_stays_zero_under_every_schedule():
    assert ExponentialDecaySchedule(0.0, decay_size=5, warmup_learning_rate=0.1,
                                    warmup_size=3)(1) == 0.0
    assert ManualStepSchedule(0.0, (2,), (0.5,))(5) == 0.0
    assert ManualStepSchedule(0.0, (2,), (0.5,), warmup=True)(1) == 0.0
