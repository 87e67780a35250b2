"""The run record (metrics.json): read once, written whole by one writer, never left broken."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import PROJECT
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.run_dir import RunRecord, read_metrics

# Writes two records of ~2 MB in turn, forever: a kill lands inside a write most of the time.
WRITER = """
import sys
from {{ cookiecutter.package }}.core.run_dir import RunRecord
record = RunRecord(sys.argv[1])
print("ready", flush=True)
versions = [{"version": 0, "padding": "a" * 2_000_000}, {"version": 1, "padding": "b" * 2_000_000}]
while True:
    for version in versions:
        record.values = dict(version)
        record.write()
"""


def test_updates_keep_what_they_do_not_renew(tmp_path):
    record = RunRecord(str(tmp_path))
    assert record.values == {}
    record.update(calibration={"steps_per_execution": 4}, global_step=8)
    record.write()
    again = RunRecord(str(tmp_path))
    again.update(global_step=16)
    again.write()
    assert read_metrics(str(tmp_path)) == {"calibration": {"steps_per_execution": 4}, "global_step": 16}
    assert [path.name for path in tmp_path.iterdir()] == ["metrics.json"]  # no temporary file left


def test_a_broken_record_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "metrics.json").write_text('{"global_step": 4')
    with pytest.raises(UserError, match=r"metrics.json is not valid JSON .*; move it away") as error:
        RunRecord(str(tmp_path))
    assert "\n" not in str(error.value)


def test_a_writer_killed_mid_write_leaves_the_old_or_the_new_record(tmp_path):
    env = {"PYTHONPATH": str(PROJECT / "src"), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"}
    for attempt in range(5):
        process = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert process.stdout.readline().strip() == "ready"
        time.sleep(0.2 + 0.07 * attempt)  # several writes in, at a different point of one each time
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        written = json.loads((tmp_path / "metrics.json").read_text())
        assert written["version"] in (0, 1) and len(written["padding"]) == 2_000_000
