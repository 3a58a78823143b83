"""The short form of the soak (e2e/soak.py): a few minutes of varying autoscaled load, with the same checks
as the hour-long run (no missed evaluation, no error-level operator log, operator alive)."""

from __future__ import annotations

import pytest

from e2e import soak


def test_short_soak(tmp_path):
    from flashserve_testbed.localcluster import ToolchainMissing, toolchain_bin

    try:
        toolchain_bin()
    except ToolchainMissing as exc:
        pytest.skip(f"needs the local cluster toolchain: {exc}")
    figures = soak.run(3, cluster_dir=tmp_path / "soak-cluster")
    print({k: v for k, v in figures.items() if k != "series"})
    assert figures["requests"] > 50 and not figures["request_errors"], figures
    assert soak.verdict(figures) == [], figures
