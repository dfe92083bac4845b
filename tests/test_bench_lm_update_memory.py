"""rlweave bench lm-update-memory: both sides take the same update; the JSON says what it rests on."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli


def test_tiny_run_reports_both_sides_with_the_same_loss(tmp_path):
    out = tmp_path / "m.json"
    rc, text = run_cli("bench", "lm-update-memory", "--recipe", "grpo-calc", "--prompt-tokens", "20", "--response-tokens", "10",
                       "--micro", "32", "--set", "model.hidden_size=32", "--set", "model.intermediate_size=64", "--json", str(out))
    assert rc == 0, text
    r = json.loads(out.read_text())
    for key in ("benchmark", "command", "headline", "protocol", "environment", "process_env", "sides", "ratio", "peak_rss_mb"):
        assert key in r, key
    assert r["sides"]["whole"]["micro"] is None and r["sides"]["micro"]["micro"] == 32
    (whole,), (micro,) = r["runs"]["whole"], r["runs"]["micro"]
    assert whole["rows"] == micro["rows"] == 128
    assert micro["loss_policy"] == pytest.approx(whole["loss_policy"], rel=1e-5)
    assert r["ratio"] == pytest.approx(r["peak_rss_mb"]["micro"] / r["peak_rss_mb"]["whole"])
