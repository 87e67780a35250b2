"""`make tensorboard` listens on this machine only (TensorBoard has no authentication) unless
BIND_ALL=1; `make tpu-tunnel` is how a laptop reaches a TPU VM's TensorBoard and profiler."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import PROJECT

LISTEN = "0A"  # the TCP state in /proc/net/tcp*
SERVING = re.compile(r"^TensorBoard \S+ at http://\S+:(\d+)/")


def listening_addresses(port: int) -> set[str]:
    """The local addresses listening on `port`, as /proc/net/tcp and tcp6 write them (hex)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == LISTEN and int(hex_port, 16) == port:
                found.add(address)
    return found


def answers(port: int) -> bool:
    """Whether a server on 127.0.0.1:`port` answers an HTTP request."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=5):
            return True
    except OSError:
        return False


LOOPBACK_V4 = "0100007F"  # 127.0.0.1, little-endian
ANY = {"00000000", "0" * 32}  # 0.0.0.0 and ::


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the listening sockets from Linux's /proc")
@pytest.mark.parametrize("bind_all", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_tensorboard_listens_on_loopback_unless_bind_all(tmp_path, bind_all):
    (tmp_path / "logs").mkdir()
    # TENSORBOARD_PORT=0: the server binds a port the system picks and names it in its serving line,
    # so no other process can take the port between choosing it and binding it.
    command = ["make", "--no-print-directory", "tensorboard", f"VENV={sys.prefix}", "TENSORBOARD_PORT=0"]
    command += [f"RUN_DIR={tmp_path}", *(["BIND_ALL=1"] if bind_all else [])]
    server = subprocess.Popen(
        command, cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        port, deadline = None, time.monotonic() + 180
        while port is None:
            assert server.poll() is None or not lines.empty(), f"make tensorboard exited:\n{''.join(seen)}"
            assert time.monotonic() < deadline, f"no serving line within 180 s:\n{''.join(seen)}"
            try:
                seen.append(lines.get(timeout=0.5))
            except queue.Empty:
                continue
            serving = SERVING.match(seen[-1])
            port = int(serving.group(1)) if serving else None
        # TensorBoard binds every socket it serves on before its serving loop starts: once it answers
        # a request, the table of listening sockets is complete.
        while not answers(port):
            assert server.poll() is None, f"make tensorboard exited:\n{''.join(seen)}"
            assert time.monotonic() < deadline, f"no answer on port {port} within 180 s:\n{''.join(seen)}"
            time.sleep(0.2)
        addresses = listening_addresses(port)
        # The profile plugin (its version pinned beside TensorFlow's in each set of requirements.txt)
        # loads with this environment's protobuf: TensorBoard lists it.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=30) as response:
            plugins = json.loads(response.read())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        reader.join(timeout=10)
    output = "".join(seen + list(lines.queue))
    assert "profile" in plugins, (sorted(plugins), output)
    if bind_all:
        assert addresses & ANY, addresses
        assert "warning: BIND_ALL=1 serves" in output
    else:
        assert addresses == {LOOPBACK_V4}, addresses
        assert "warning" not in output


def test_the_tunnel_forwards_tensorboard_and_profiler_ports():
    result = subprocess.run(
        ["make", "--no-print-directory", "tpu-tunnel", "DRY_RUN=1", "TENSORBOARD_PORT=6007", "PROFILER_PORT=9013"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [command] = [line.split() for line in result.stdout.splitlines() if line.startswith("gcloud")]
    assert command[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
    forwarded = command[command.index("--") + 1 :]
    assert forwarded == ["-L", "6007:localhost:6007", "-L", "9013:localhost:9013"]
