import math

import pytest
from google.protobuf import text_format

from hashrec.config import optimizer_pb2
from hashrec.train.errors import TrainError
from hashrec.train.lr_schedules import (
    ConstantSchedule,
    CosineAnnealingSchedule,
    CosineAnnealingWarmRestartsSchedule,
    ExponentialDecaySchedule,
    LinearDecaySchedule,
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
    lambda: LinearDecaySchedule(1.0, total_size=4, warmup_size=4),
    lambda: CosineAnnealingSchedule(1.0, T_max=0),
    lambda: CosineAnnealingWarmRestartsSchedule(1.0, T_0=0),
    lambda: CosineAnnealingWarmRestartsSchedule(1.0, T_0=3, T_mult=0),
], ids=["decay-size", "decay-factor", "unpaired", "unsorted", "linear-total", "cosine-tmax",
        "restarts-t0", "restarts-tmult"])
def test_invalid_schedules(make):
    with pytest.raises(ValueError):
        make()


def test_linear_decay_warms_up_then_falls_to_the_floor_at_total_size():
    sched = LinearDecaySchedule(1.0, total_size=10, min_learning_rate=0.2,
                                warmup_learning_rate=0.0, warmup_size=2)
    assert [sched(t) for t in (0, 1, 2, 6, 10, 50)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.6, 0.2, 0.2])


def test_cosine_annealing_follows_half_a_cosine_after_the_warmup():
    sched = CosineAnnealingSchedule(0.01, T_max=4, warmup_learning_rate=0.002, warmup_size=2)
    cos = [0.005 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert [sched(t) for t in range(8)] == pytest.approx(
        [0.002, 0.006, cos[0], cos[1], cos[2], cos[3], cos[4], 0.0])
    floor = CosineAnnealingSchedule(1.0, T_max=2, min_learning_rate=0.5, by_epoch=True)
    assert (floor(999, epoch=1), floor(0, epoch=9)) == pytest.approx((0.75, 0.5))


def test_cosine_warm_restarts_restart_at_the_base_rate_with_growing_periods():
    sched = CosineAnnealingWarmRestartsSchedule(0.01, T_0=2, T_mult=2)
    half = lambda k, period: 0.005 * (1 + math.cos(math.pi * k / period))  # noqa: E731
    # periods: steps 0-1 (2 long), 2-5 (4), 6-13 (8)
    assert [sched(t) for t in range(8)] == pytest.approx(
        [0.01, half(1, 2), 0.01, half(1, 4), half(2, 4), half(3, 4), 0.01, half(1, 8)])
    fixed = CosineAnnealingWarmRestartsSchedule(1.0, T_0=3, min_learning_rate=0.1)
    assert [fixed(t) for t in (0, 3, 6)] == [1.0, 1.0, 1.0]
    assert fixed(4) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 3)))


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
    cosine = build_schedule(_dense(
        "adam_optimizer { lr: 0.1 } cosine_annealing_learning_rate { T_max: 10 "
        "min_learning_rate: 0.01 }"), 0.1, "x")
    assert cosine(10) == pytest.approx(0.01) and cosine(5) == pytest.approx(0.055)
    linear = build_schedule(_dense(
        "adam_optimizer { lr: 0.1 } linear_decay_learning_rate { total_size: 10 }"), 0.1, "x")
    assert linear(5) == pytest.approx(0.05)
    restarts = build_schedule(_dense(
        "adam_optimizer { lr: 0.1 } cosine_annealing_warm_restarts_learning_rate { T_0: 4 "
        "T_mult: 2 }"), 0.1, "x")
    assert restarts(4) == pytest.approx(0.1) and restarts(8) == pytest.approx(0.05)


def test_build_error_names_where():
    with pytest.raises(TrainError, match="train_config.dense_optimizer.*decay_size"):
        build_schedule(_dense("adam_optimizer { lr: 0.1 } exponential_decay_learning_rate {}"),
                       0.1, "train_config.dense_optimizer")


def test_a_zero_base_rate_stays_zero_under_every_schedule():
    assert ExponentialDecaySchedule(0.0, decay_size=5, warmup_learning_rate=0.1,
                                    warmup_size=3)(1) == 0.0
    assert ManualStepSchedule(0.0, (2,), (0.5,))(5) == 0.0
    assert ManualStepSchedule(0.0, (2,), (0.5,), warmup=True)(1) == 0.0
    assert LinearDecaySchedule(0.0, total_size=5, warmup_learning_rate=0.1,
                               warmup_size=2)(1) == 0.0
    assert CosineAnnealingSchedule(0.0, T_max=5, min_learning_rate=0.1)(3) == 0.0
    assert CosineAnnealingWarmRestartsSchedule(0.0, T_0=5, min_learning_rate=0.1)(3) == 0.0
