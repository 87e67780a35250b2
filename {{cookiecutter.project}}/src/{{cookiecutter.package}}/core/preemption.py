"""Preemption and maintenance notices, as Cloud TPU VMs really deliver them.

A Spot or preemptible TPU VM is stopped with an ACPI soft-off, which reaches the process as
SIGTERM, and about 30 s later with a hard stop; the GCE metadata server then reports
`instance/preempted` = TRUE. Upcoming host maintenance shows in `instance/maintenance-event`
(anything but NONE) and `instance/upcoming-maintenance` (a JSON document, 404 when there is none).
TensorFlow's own PreemptionCheckpointHandler and Keras' BackupAndRestore preemption saves do
nothing on Cloud TPU VMs, so training watches both itself: the SIGTERM handler in callbacks.py and
`MetadataWatcher` here. Either one asks the training loop to save a checkpoint and exit with
status 143 at the next execution boundary; the same command resumes.

The watcher is a daemon thread that never raises: errors are counted, and when no metadata
server answers at all (off Google Cloud) it switches itself off after the first try. The host is
GCE_METADATA_HOST when set (as google-auth reads it), else metadata.google.internal.
"""

from __future__ import annotations

import http.client
import logging
import os
import socket
import threading
from typing import Callable

log = logging.getLogger(__name__)

DEFAULT_HOST = "metadata.google.internal"
HEADERS = {"Metadata-Flavor": "Google"}
PREEMPTED = "/computeMetadata/v1/instance/preempted"
MAINTENANCE_EVENT = "/computeMetadata/v1/instance/maintenance-event"
UPCOMING_MAINTENANCE = "/computeMetadata/v1/instance/upcoming-maintenance"


def metadata_host() -> str:
    return os.environ.get("GCE_METADATA_HOST") or DEFAULT_HOST


def notice(get: Callable[[str], tuple[int, str]]) -> str | None:
    """The notice the metadata server gives (a reason to stop), or None. `get(path)` returns
    (HTTP status, body)."""
    status, body = get(PREEMPTED)
    if status == 200 and body.strip().upper() == "TRUE":
        return "the metadata server reports instance/preempted=TRUE"
    status, body = get(MAINTENANCE_EVENT)
    if status == 200 and body.strip() and body.strip().upper() != "NONE":
        return f"host maintenance: instance/maintenance-event={body.strip()}"
    status, body = get(UPCOMING_MAINTENANCE)
    if status == 200 and body.strip():
        return f"host maintenance: instance/upcoming-maintenance={body.strip()[:120]}"
    return None


class MetadataWatcher(threading.Thread):
    """Polls the metadata server every `interval` seconds; calls `on_notice(reason)` once."""

    def __init__(
        self, on_notice: Callable[[str], None], interval: float = 5.0, timeout: float = 1.0, host: str | None = None
    ):
        super().__init__(name="metadata-watcher", daemon=True)
        self.on_notice, self.interval, self.timeout = on_notice, interval, timeout
        self.host = host or metadata_host()
        self.stopped = threading.Event()
        self.errors = 0
        self.active = True
        self.reason: str | None = None

    def get(self, path: str) -> tuple[int, str]:
        connection = http.client.HTTPConnection(self.host, timeout=self.timeout)
        try:
            connection.request("GET", path, headers=HEADERS)
            response = connection.getresponse()
            return response.status, response.read(4096).decode("utf-8", "replace")
        finally:
            connection.close()

    def poll(self) -> str | None:
        """One look at the metadata server; None when there is no notice or it cannot be asked."""
        try:
            return notice(self.get)
        except (OSError, socket.timeout, http.client.HTTPException) as error:
            self.errors += 1
            if self.errors == 1 and isinstance(error, (ConnectionRefusedError, socket.gaierror)):
                # Nothing listens there (off Google Cloud, or a closed port in tests): stop asking.
                self.active = False
                log.info(
                    "no GCE metadata server at %s (%s): preemption notices come from SIGTERM only",
                    self.host,
                    type(error).__name__,
                )
            return None

    def run(self) -> None:
        while self.active and not self.stopped.is_set():
            reason = self.poll()
            if reason:
                self.reason = reason
                self.on_notice(reason)
                return
            self.stopped.wait(self.interval)

    def stop(self) -> None:
        self.stopped.set()
