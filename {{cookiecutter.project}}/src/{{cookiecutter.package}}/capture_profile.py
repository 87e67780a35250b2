"""On-demand profile of a running job (`make profile`): the job must run with runtime.profiler_port.

    make train ARGS="runtime.profiler_port=9012"   # in one shell: the job, with its profiler server
    make profile DURATION=3000                      # in another, while it trains

The trace lands in LOGDIR/plugins/profile/<timestamp>/ and shows in TensorBoard's Profile tab.
On a Pod slice, pass every worker's address with --host (comma-separated) to trace all hosts.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .core.errors import UserError, run_cli
from .core.profiler import connection_error


def how_to_start(port: int) -> str:
    return (
        f"start training with `make train ARGS=runtime.profiler_port={port}`, then run `make profile "
        f"PROFILER_PORT={port}` while it trains"
    )


def check_listening(hosts: Sequence[str], port: int) -> None:
    """Fails in one line when nothing accepts connections on a host:port, before TensorFlow retries
    a capture three times and ends in a RuntimeError."""
    for host in hosts:
        error = connection_error(host, port)
        if error:
            reason = error.strerror or type(error).__name__
            raise UserError(f"no profiler server answered on {host}:{port} ({reason}): {how_to_start(port)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the job's runtime.profiler_port")
    parser.add_argument("--host", default="localhost", help="host(s) running the job, comma-separated")
    parser.add_argument("--duration_ms", type=int, default=2000)
    parser.add_argument("--logdir", required=True, help="the run's logs/ folder (local or gs://)")
    args = parser.parse_args(argv)
    if args.duration_ms <= 0:
        raise UserError(f"the capture needs a positive duration, got {args.duration_ms} ms: set DURATION=2000")
    if not 0 < args.port < 65536:
        raise UserError(f"--port must be the job's runtime.profiler_port (1-65535), got {args.port}: set PROFILER_PORT")
    hosts = [host.strip() for host in args.host.split(",") if host.strip()]
    if not hosts:
        raise UserError(f"--host names no host, got {args.host!r}: pass localhost or the workers' addresses")
    check_listening(hosts, args.port)
    import tensorflow as tf

    service = ",".join(f"grpc://{host}:{args.port}" for host in hosts)
    print(f"capturing {args.duration_ms} ms from {service} into {args.logdir}/plugins/profile", flush=True)
    try:
        tf.profiler.experimental.client.trace(service, args.logdir, args.duration_ms)
    except (RuntimeError, tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as error:
        # TensorFlow 2.20 raises a plain RuntimeError("UNAVAILABLE: No trace event was collected ...")
        # when the server answered but recorded nothing (three tries), e.g. while the job compiles.
        if isinstance(error, RuntimeError) and not str(error).startswith(("UNAVAILABLE", "DEADLINE_EXCEEDED")):
            raise
        addresses = ", ".join(f"{host}:{args.port}" for host in hosts)
        raise UserError(
            f"the profiler server on {addresses} answered but recorded nothing in {args.duration_ms} ms: "
            f"run `make profile` while the job trains (not while it compiles or waits), or raise "
            f"DURATION"
        ) from None
    print("done: open `make tensorboard` -> Profile")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
