"""TensorFlow's C++ log lines that say nothing a user can act on, left out of stderr.

TensorFlow's C++ code writes to file descriptor 2 directly, so Python's logging cannot filter it:
`without_lines` sends the descriptor to a temporary file for the length of a block, then writes back
every line but the ones that match. Only known lines are left out, and only where they are false
or harmless; everything else (errors included) shows, in its order, when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

# TensorFlow's CUDA build, on a machine without an NVIDIA driver (/proc/driver/nvidia), looks for a
# GPU at its first look at the devices and logs the stub driver's answer at ERROR level.
NO_GPU_PROBE = re.compile(r"failed call to cuInit")
# oneDNN's graph pass, on the first run of a graph with an op of a type it has no kernel for (int32
# arithmetic, a transpose of a bool mask), logs at ERROR level that it leaves that op to the default
# (Eigen) kernels: "oneDNN supports DT_INT32 only on platforms with AVX-512. Falling back to ...". A
# notice, logged even on CPUs that have AVX-512, and once per process, for the first such type only.
ONEDNN_TYPE_NOTICE = re.compile(r"oneDNN supports DT_[A-Z0-9_]+ only on platforms with AVX-512")


def has_nvidia_driver() -> bool:
    return os.path.exists("/proc/driver/nvidia")


@contextlib.contextmanager
def without_lines(pattern: re.Pattern):
    """Runs the block with stderr (file descriptor 2) captured; at its end, exception or not, writes
    back every captured line that `pattern` does not match."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not pattern.search(line):
                    sys.stderr.write(line)
            sys.stderr.flush()


def spend_onednn_notice() -> None:
    """Runs one graph that draws oneDNN's notice (ONEDNN_TYPE_NOTICE: a transpose of a bool tensor on
    the CPU) with the line left out. TensorFlow logs the notice once per process, whatever type comes
    first, so no later graph (a training step, an evaluation, an export) logs it again. Needs
    TensorFlow started: call it once the devices are configured."""
    import tensorflow as tf

    with without_lines(ONEDNN_TYPE_NOTICE), tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
        tf.function(lambda mask: tf.transpose(mask))(tf.constant([[True, False]])).numpy()
