"""TensorFlow's C++ log lines that say nothing a user can act on, left out of stderr.

TensorFlow's C++ code writes to file descriptor 2 directly, so Python's logging cannot filter it:
`without_lines` sends the descriptor to a temporary file for the length of a block, then writes back
every line but the ones that match. Only known lines are left out, and only where they are false
or harmless; everything else (errors included) shows, in its order, when the block ends.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
import warnings

# TensorFlow's CUDA build, on a machine without an NVIDIA driver (/proc/driver/nvidia), looks for a
# GPU at its first look at the devices and logs the stub driver's answer at ERROR level.
NO_GPU_PROBE = re.compile(r"failed call to cuInit")
# oneDNN's graph pass, on the first run of a graph with an op of a type it has no kernel for (int32
# arithmetic, a transpose of a bool mask), logs at ERROR level that it leaves that op to the default
# (Eigen) kernels: "oneDNN supports DT_INT32 only on platforms with AVX-512. Falling back to ...". A
# notice, logged even on CPUs that have AVX-512, and once per process, for the first such type only.
ONEDNN_TYPE_NOTICE = re.compile(r"oneDNN supports DT_[A-Z0-9_]+ only on platforms with AVX-512")


# TensorFlow 2.19's CUDA build, at its import, registers its CUDA plugins (cuFFT, cuDNN, cuBLAS) and
# XLA's computation placer twice and says so at ERROR and WARNING level, after absl's preface line;
# a CPU or TPU run is unaffected (2.20 no longer logs them).
IMPORT_NOTICES = re.compile(
    r"Unable to register cu[A-Z]+ factory: Attempting to register factory for plugin cu[A-Z]+ when one has "
    r"already been registered|computation placer already registered\. Please check linkage|"
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
)
# google-api-core (2.33 in the TensorFlow 2.19 set) warns at import, in every command, that a future
# release will drop this Python version.
PYTHON_SUPPORT_WARNING = r"You are using a Python version .* which Google will stop supporting"


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


class _QuietImport(importlib.abc.MetaPathFinder):
    """Finds the `tensorflow` package as the other finders do and runs its import with the
    IMPORT_NOTICES lines left out of stderr."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def quiet(module):
            with without_lines(IMPORT_NOTICES):
                exec_module(module)

        spec.loader.exec_module = quiet
        return spec


def quiet_tensorflow_import() -> None:
    """Leaves TensorFlow's import notices (IMPORT_NOTICES) and google-api-core's Python-version
    warning out of stderr, for whichever module imports them first (the package does this once)."""
    warnings.filterwarnings("ignore", message=PYTHON_SUPPORT_WARNING, category=FutureWarning)
    if "tensorflow" not in sys.modules and not any(isinstance(finder, _QuietImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietImport())
