import io
import re

import pytest
from test_training import TINY

from xattn.config import TrainConfig, load_config
from xattn.progress import BarDisplay, Budget, LineDisplay, NoDisplay, StepStatus, clock, line, open_display
from xattn.training import train


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _status(step: int, seconds: float) -> StepStatus:
    return StepStatus(step=step, epoch=3, loss=2.3454, lr=5e-4, tokens_per_s=4012.4, seconds=seconds)


def test_clock():
    assert [clock(s) for s in (0, 9.6, 62, 3599, 3725)] == ["0:00", "0:10", "1:02", "59:59", "1:02:05"]


def test_a_line_under_a_time_budget_counts_down_the_budget():
    budget = Budget.of(TrainConfig(max_steps=100000, max_minutes=2.0))
    assert line(_status(200, 62.0), budget) == \
        "step 200  epoch 3  loss 2.345  lr 5.0e-04  4012 tok/s  1:02 elapsed, 0:58 left of the 2:00 budget"
    assert line(_status(900, 125.0), budget).endswith("2:05 elapsed, 0:00 left of the 2:00 budget")


def test_a_line_under_a_step_limit_estimates_the_time_left_from_the_pace():
    budget = Budget.of(TrainConfig(max_steps=1000, max_minutes=0.0))
    assert line(_status(200, 62.0), budget).startswith("step 200/1000  epoch 3")
    assert line(_status(200, 62.0), budget).endswith("1:02 elapsed, about 4:08 left")  # 800 steps at 0.31 s
    assert line(_status(0, 0.0), budget).endswith("0:00 elapsed")


def test_a_step_budget_with_a_time_cap_reads_as_steps_once_the_pace_says_they_come_first():
    budget = Budget.of(TrainConfig(max_steps=900, max_minutes=10.0))
    assert line(_status(0, 0.0), budget).endswith("0:00 elapsed, 10:00 left of the 10:00 budget")
    assert line(_status(200, 25.0), budget).startswith("step 200/900  epoch 3")
    assert line(_status(200, 25.0), budget).endswith("0:25 elapsed, about 1:28 left (cap 10:00)")  # 700 at 0.125 s
    slow = line(_status(20, 25.0), budget)  # 900 steps at 1.25 s would take 18:45: the cap comes first
    assert slow.startswith("step 20  epoch") and slow.endswith("9:35 left of the 10:00 budget")


@pytest.mark.parametrize("minutes, percent", [(2.0, 100 * 62 / 120), (0.0, 100 * 200 / 5000), (60.0, 100 * 200 / 5000)])
def test_on_a_terminal_the_bar_runs_against_the_binding_limit(minutes, percent):
    tc = TrainConfig(max_steps=5000, max_minutes=minutes)
    display = open_display(tc, step=100, seconds=30.0, stream=Terminal())
    assert isinstance(display, BarDisplay) and display.bar.total == 100
    display.update(_status(200, 62.0))
    assert display.bar.n == pytest.approx(percent)
    display.close()


def test_elsewhere_one_line_per_logged_step_and_no_carriage_return():
    stream = io.StringIO()
    display = open_display(TrainConfig(max_steps=50, log_every=5), step=0, seconds=0.0, stream=stream)
    assert isinstance(display, LineDisplay)
    for step in range(1, 24):
        display.update(_status(step, step * 0.5))
    display.close()
    lines = stream.getvalue().splitlines()
    assert [text.split()[1] for text in lines] == ["5/50", "10/50", "15/50", "20/50"]
    assert "\r" not in stream.getvalue()


def test_quiet_shows_nothing_even_on_a_terminal():
    stream = Terminal()
    display = open_display(TrainConfig(log_every=1), step=0, seconds=0.0, enabled=False, stream=stream)
    assert isinstance(display, NoDisplay)
    display.update(_status(1, 1.0))
    display.close()
    assert stream.getvalue() == ""


def test_training_into_a_log_prints_one_line_per_logged_step(tmp_path, capsys):
    train(load_config(None, TINY + ["train.max_steps=6", "train.log_every=2"]), tmp_path)
    out, err = capsys.readouterr()
    assert "\r" not in err
    steps = [re.fullmatch(r"step (\d+)/6  epoch \d+  loss [\d.]+  lr \S+  \d+ tok/s  \d+:\d\d elapsed.*", text)
             for text in err.splitlines()]
    assert all(steps) and [int(m.group(1)) for m in steps] == [2, 4, 6], err
    assert "done (max_steps) at step 6" in out
