"""Starts one program as N local processes: a multi-process mesh on one machine.

Each process gets its own task in a loopback cluster (``TF_CONFIG``) and the
number of local devices to make (``MTF_DEVICES_PER_PROCESS``); the program calls
:func:`mtf_core.lowering.cluster.initialize_from_env` and builds its mesh on
the devices it returns.  On a real cluster, set ``TF_CONFIG`` on each host
(same cluster list, that host's task index) and run the same program.

    python -m mtf_core.lowering.launcher --processes 2 --devices_per_process 4 \\
        -- python my_training.py --steps 10

If any process fails, the others are stopped: a peer that has gone leaves the
rest waiting in collectives for ever.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mtf_core.errors import LoweringError
from mtf_core.lowering.cluster import DEVICES_PER_PROCESS_ENV, ClusterSpec


def free_ports(n: int, host: str = "localhost") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def local_cluster(
    num_processes: int, ports: Sequence[int] | None = None
) -> list[ClusterSpec]:
    """One :class:`ClusterSpec` per task of a loopback cluster."""
    if num_processes < 1:
        raise LoweringError(f"num_processes must be >= 1, got {num_processes}")
    ports = list(ports) if ports is not None else free_ports(num_processes)
    if len(ports) != num_processes:
        raise LoweringError(
            f"{len(ports)} ports given for {num_processes} processes: {ports}"
        )
    addresses = tuple(f"localhost:{p}" for p in ports)
    return [ClusterSpec(addresses, t) for t in range(num_processes)]


@dataclass(frozen=True)
class ProcessResult:
    """How one task ended."""

    task: int
    returncode: int
    stdout: str
    stderr: str


def launch(
    command: Sequence[str],
    num_processes: int,
    devices_per_process: int,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    ports: Sequence[int] | None = None,
) -> list[ProcessResult]:
    """Runs ``command`` as ``num_processes`` tasks of a loopback cluster and
    waits for all of them; returns their results in task order.

    A task that fails (or the timeout) stops the others; their return codes
    are then negative (killed) or whatever they exited with.
    """
    specs = local_cluster(num_processes, ports)
    base = dict(os.environ if env is None else env)
    procs = []
    logs = []
    for spec in specs:
        penv = dict(base)
        penv["TF_CONFIG"] = spec.to_tf_config()
        penv[DEVICES_PER_PROCESS_ENV] = str(devices_per_process)
        # Files, not pipes: a chatty task must not block on a full pipe.
        out = tempfile.TemporaryFile(mode="w+")
        err = tempfile.TemporaryFile(mode="w+")
        logs.append((out, err))
        procs.append(subprocess.Popen(list(command), env=penv, stdout=out, stderr=err))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            failed = any(p.returncode not in (None, 0) for p in procs)
            late = deadline is not None and time.monotonic() > deadline
            if failed or late:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    results = []
    for t, (p, (out, err)) in enumerate(zip(procs, logs)):
        out.seek(0)
        err.seek(0)
        results.append(ProcessResult(t, p.returncode, out.read(), err.read()))
        out.close()
        err.close()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mtf_core.lowering.launcher",
        description="Run a program as N processes of a loopback cluster.",
    )
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--devices_per_process", type=int, default=4)
    p.add_argument("--timeout_s", type=float, default=None)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- program and args")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the program to run after --")
    results = launch(command, args.processes, args.devices_per_process, args.timeout_s)
    for r in results:
        for line in r.stdout.splitlines():
            print(f"[task {r.task}] {line}")
        for line in r.stderr.splitlines():
            print(f"[task {r.task}] {line}", file=sys.stderr)
    codes = [r.returncode for r in results]
    print(f"return codes: {codes}", file=sys.stderr)
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
