"""The run record (metrics.json): read once, written whole by one writer, never left broken."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from conftest import PROJECT
from {{ cookiecutter.package }}.core.errors import UserError
from {{ cookiecutter.package }}.core.run_dir import RunRecord

# Writes a record, then a new one through the real write with a hook that kills the process at
# `argv[2]`: half of the new content flushed to its file, or the content written but not yet renamed.
KILLED_WRITER = """
import os, signal, sys
import tensorflow as tf
from {{ cookiecutter.package }}.core.run_dir import RunRecord

record = RunRecord(sys.argv[1])
record.values = {"version": 0, "padding": "a" * 100_000}
record.write()
write, rename = tf.io.gfile.GFile.write, tf.io.gfile.rename

def half_then_killed(handle, content):
    write(handle, content[: len(content) // 2])
    handle.flush()
    os.kill(os.getpid(), signal.SIGKILL)

def killed_before_renaming(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[2] == "mid-write":
    tf.io.gfile.GFile.write = half_then_killed
else:
    tf.io.gfile.rename = killed_before_renaming
record.values = {"version": 1, "padding": "b" * 100_000}
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
    assert RunRecord(str(tmp_path)).values == {"calibration": {"steps_per_execution": 4}, "global_step": 16}
    assert [path.name for path in tmp_path.iterdir()] == ["metrics.json"]  # no temporary file left


def test_the_keys_read_in_several_places_have_names(tmp_path):
    record = RunRecord(str(tmp_path))
    assert (record.starts, record.last_start, record.history, record.calibration) == ([], None, [], None)
    starts = [{"initial_step": 0, "furthest_step": 8, "end": "preempted"}, {"initial_step": 8, "end": "finished"}]
    record.update(
        goodput={"per_start": starts},
        history=[{"step": 4, "loss": 1.0}],
        calibration={"steps_per_execution": 4},
        examples_per_second=12.5,
    )
    record.write()
    again = RunRecord(str(tmp_path))
    assert again.starts == starts and again.last_start == starts[-1] and again.history == [{"step": 4, "loss": 1.0}]
    assert again.calibration == {"steps_per_execution": 4} and again.examples_per_second == 12.5


def test_a_broken_record_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "metrics.json").write_text('{"global_step": 4')
    with pytest.raises(UserError, match=r"metrics.json is not valid JSON .*; move it away") as error:
        RunRecord(str(tmp_path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("killed", ["mid-write", "before-rename"])
def test_a_writer_killed_mid_write_leaves_the_old_record(tmp_path, killed):
    """SIGKILLed with half of the new record written, or with all of it written but not in place:
    metrics.json is the old record, whole."""
    env = {"PYTHONPATH": str(PROJECT / "src"), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path), killed],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert RunRecord(str(tmp_path)).values == {"version": 0, "padding": "a" * 100_000}
