"""The profiler's two ways in: a server that `make profile` captures from on demand, and its probe.

The trace window (`runtime.profile_steps`) is a training callback (callbacks.ProfileWindow); this
module is what both the training process and the capture command need to agree on a port.
"""

from __future__ import annotations

import socket

import tensorflow as tf

# Long enough for a TPU VM in the same zone; a firewalled host would otherwise hang the capture.
CONNECT_TIMEOUT_SECONDS = 5


def connection_error(host: str, port: int) -> OSError | None:
    """Why nothing accepts connections on host:port, or None when something does."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS).close()
    except OSError as error:
        return error
    return None


def port_is_free(port: int) -> bool:
    """Whether the profiler server can have `port` to itself: nothing listens there, and its gRPC
    server can bind it on every address (IPv6 and IPv4, with the port reuse gRPC asks for)."""
    if connection_error("127.0.0.1", port) is None:  # a server answers: gRPC would share the port with it
        return False
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = ("::", port)
    except OSError:  # no IPv6 on this host
        probe, address = socket.socket(socket.AF_INET), ("0.0.0.0", port)
    with probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind(address)
        except OSError:
            return False
    return True


def start_server(port: int) -> bool:
    """Starts the server `make profile` captures from. On a port something else holds, TensorFlow
    would only log that it cannot bind: this says so, and the run trains on without the server."""
    if not port_is_free(port):
        print(
            f"warning: profiler port {port} is in use (another training job on this machine?): this run has "
            "no profiler server; set runtime.profiler_port to a free port for `make profile`, or 0 for none",
            flush=True,
        )
        return False
    tf.profiler.experimental.server.start(port)
    print(f"profiler server on port {port}: `make profile` captures a trace", flush=True)
    return True
