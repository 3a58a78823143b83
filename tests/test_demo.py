"""The demo's verdict: `flashserve demo` (and `make demo-quick` in `make test`) fails unless the run showed
what the README promises."""

from flashserve_testbed.demo import QUICK_SCHEDULE, verdict
from flashserve_testbed.loadgen.schedule import parse

GOOD = {"requests": 120, "errors": 0, "max_replicas": 4, "final_replicas": 1}


def test_a_run_that_scaled_out_and_back_passes():
    assert verdict(GOOD) == []


def test_each_broken_promise_is_named():
    assert verdict({**GOOD, "max_replicas": 1}) == ["the serving never scaled out (max 1 replicas)"]
    assert verdict({**GOOD, "final_replicas": 3}) == ["the serving did not scale back in to 1 (ended at 3)"]
    assert verdict({**GOOD, "errors": 5}) == ["5 of 120 requests failed"]
    assert "no request was served" in verdict({**GOOD, "requests": 0, "max_replicas": 1})


def test_quick_schedule_is_short_and_bursts():
    sched = parse(QUICK_SCHEDULE)
    assert sched.duration <= 150
    assert sched.peak >= 32 and sched.users(sched.duration - 1) <= 8
