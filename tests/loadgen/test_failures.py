"""What the load generator does with its own failures and with flags that would never end a run."""

from __future__ import annotations

import asyncio

import pytest
from flashserve_testbed import traces
from flashserve_testbed.loadgen import cli, mooncake, runner


def test_a_session_that_raises_fails_the_replay_instead_of_vanishing_from_the_counts(monkeypatch):
    def broken(*args, **kwargs):
        raise OverflowError("boom")

    monkeypatch.setattr(mooncake.PromptBuilder, "text", broken)  # before any request: nothing is contacted
    trace = traces.parse([(1, {"timestamp": 0, "input_length": 10, "output_length": 5}),
                          (2, {"timestamp": 5, "input_length": 10, "output_length": 5})])  # fmt: skip
    with pytest.raises(RuntimeError, match="2 of 2 sessions failed in the load generator.*OverflowError: boom"):
        asyncio.run(runner.replay_trace("http://127.0.0.1:9/v1", trace, "m", drain_seconds=1))


@pytest.mark.parametrize("flag", ["--trace-speedup=nan", "--time-scale=inf", "--trace-session-gap=nan",
                                  "--trace-session-gap=-1"])  # fmt: skip
def test_flags_that_are_not_finite_positive_numbers_are_refused(flag, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--base-url", "http://127.0.0.1:9/v1", flag])
    assert e.value.code == 2 and flag.split("=")[0] in capsys.readouterr().err
