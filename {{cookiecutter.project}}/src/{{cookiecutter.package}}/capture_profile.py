"""On-demand profile of a running job (`make profile`): the job must run with runtime.profiler_port.

    make profile DURATION=3000      # python -m {{ cookiecutter.package }}.capture_profile --port 9012 ...

The trace lands in LOGDIR/plugins/profile/<timestamp>/ and shows in TensorBoard's Profile tab.
On a Pod slice, pass every worker's address with --host (comma-separated) to trace all hosts.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import UserError, run_cli


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the job's runtime.profiler_port")
    parser.add_argument("--host", default="localhost", help="host(s) running the job, comma-separated")
    parser.add_argument("--duration_ms", type=int, default=2000)
    parser.add_argument("--logdir", required=True, help="the run's logs/ folder (local or gs://)")
    args = parser.parse_args(argv)
    import tensorflow as tf

    service = ",".join(f"grpc://{host}:{args.port}" for host in args.host.split(","))
    print(f"capturing {args.duration_ms} ms from {service} into {args.logdir}/plugins/profile", flush=True)
    try:
        tf.profiler.experimental.client.trace(service, args.logdir, args.duration_ms)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError) as error:
        raise UserError(f"no profiler answered at {service} ({error.message.splitlines()[0]}); start the job with "
                        f"runtime.profiler_port={args.port} and run this while it trains") from None
    print("done: open `make tensorboard` -> Profile")
    return 0


if __name__ == "__main__":
    run_cli(main, sys.argv[1:])
