"""``rlweave bench channel-vs-rlinf`` before any work: where RLinf's environment is missing or
cannot import RLinf, the command stops with one line saying so (and how to make it), writes no
JSON and starts no Ray. The measurement itself needs ``.venv-rlinf`` and lives in the benchmark."""

from __future__ import annotations

import sys

from tests.helpers import run_cli


def test_missing_rlinf_environment_is_one_line_before_work(tmp_path, capsys):
    out_json = tmp_path / "out.json"
    rc, _ = run_cli("bench", "channel-vs-rlinf", "--rlinf-python", str(tmp_path / "nope" / "python"), "--json", str(out_json))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and not out_json.exists()
    assert len(err) == 1 and "RLinf side cannot run" in err[0] and "scripts/setup.sh rlinf" in err[0]


def test_an_environment_without_rlinf_names_the_import_error(tmp_path, capsys):
    rc, _ = run_cli("bench", "channel-vs-rlinf", "--rlinf-python", sys.executable, "--json", str(tmp_path / "out.json"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert "cannot import rlinf.scheduler" in err[0] and "ModuleNotFoundError" in err[0]
