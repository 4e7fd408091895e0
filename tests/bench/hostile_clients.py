"""Figures for hostile clients: descriptor exhaustion and a client that never reads.

``python -m tests.bench.hostile_clients [emfile|slow-reader|all] [--hold S] [--flood S]``

- ``emfile``: a server whose ``RLIMIT_NOFILE`` is lowered (``prlimit`` through psutil) just
  above what it holds; connections that each send half a frame (so none is idle and none can
  be shed) are opened until one is no longer accepted. With that connection waiting in the
  backlog for ``--hold`` seconds, the server's CPU share and the growth of its log are printed
  (per second of the hold, and in all since the first connection was opened).
  Then the half-frame connections are closed and the time until a new client is answered.
- ``slow-reader``: one client pipelines ``server.status`` and ``run.list`` requests and never
  reads (a 4 KiB receive buffer, reconnecting whenever it is cut off) for ``--flood`` seconds;
  another client sends ``server.status`` one at a time throughout. Its latency (p50, p99, max)
  is printed next to the same client's latency on a quiet server.

Nothing here judges the numbers; run it on the code before and after a change and compare.
"""

from __future__ import annotations

import argparse
import resource
import select
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil

from tests.bench.common import percentile
from tests.bench.seed import build_template, seed_database
from tests.server.harness import RawClient, ServerFactory, ServerProcess

_STATUS = (
    b'{"clientId":"hog","operation":"server.status","payload":{},"requestId":"h%d",'
    b'"schema":"piwf.client.v1","type":"request"}\n'
)
_LIST = (
    b'{"clientId":"hog","operation":"run.list","payload":{"limit":500},"requestId":"l%d",'
    b'"schema":"piwf.client.v1","type":"request"}\n'
)


def _server(factory: ServerFactory, env: dict[str, str]) -> ServerProcess:
    server = factory.start(env={"PIWF_IDLE_EXIT_S": "0", **env})
    if server.ready.get("ok") is not True:
        raise SystemExit(f"the server did not start: {server.ready}")
    return server


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _answer_within(sock: socket.socket, timeout_s: float) -> bool:
    readable, _, _ = select.select([sock], [], [], timeout_s)
    return bool(readable) and bool(sock.recv(65536))


def measure_emfile(hold_s: float) -> dict[str, float]:
    """Hold a server at EMFILE with busy connections; return CPU %, log bytes/s, recovery s."""
    with tempfile.TemporaryDirectory(prefix="pwh", dir="/tmp") as root:
        factory = ServerFactory(Path(root) / "h")
        try:
            server = _server(factory, {"PIWF_FRAME_DEADLINE_S": "600"})
            process = psutil.Process(server.process.pid)
            log = server.home / "server" / "server.log"
            _soft, hard = process.rlimit(resource.RLIMIT_NOFILE)
            process.rlimit(resource.RLIMIT_NOFILE, (process.num_fds() + 6, hard))
            log_at_start = log.stat().st_size
            held: list[socket.socket] = []
            try:
                for _ in range(64):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.connect(str(server.socket_path))
                    held.append(sock)
                    if not _answer_within(sock, 1.0):
                        break  # this one waits in the backlog: accepts fail now
                    # A request and half a frame in one write; once the answer is back the
                    # server holds the half frame, so the connection is busy and never shed.
                    sock.sendall((_STATUS % 0) + b'{"clientId":')
                    if not _answer_within(sock, 10.0):
                        raise SystemExit("a held connection got no answer")
                else:
                    raise SystemExit("accepts never failed; lower the limit")
                cpu_before, log_before = _cpu_s(process), log.stat().st_size
                started = time.monotonic()
                time.sleep(hold_s)  # the measured interval itself
                elapsed = time.monotonic() - started
                cpu = _cpu_s(process) - cpu_before
                log_bytes = log.stat().st_size - log_before
                episode_bytes = log.stat().st_size - log_at_start
                rotated = log.with_name(log.name + ".1")
                rotated_bytes = rotated.stat().st_size if rotated.exists() else 0
            finally:
                for sock in held:
                    sock.close()
            recovery_started = time.monotonic()
            served = _first_answer(server, timeout_s=30.0)
            recovery = time.monotonic() - recovery_started
            return {
                "hold_s": elapsed,
                "cpu_percent": 100.0 * cpu / elapsed,
                "log_bytes_per_s": log_bytes / elapsed,
                "log_bytes_in_all": float(episode_bytes),
                "rotated_log_bytes": float(rotated_bytes),
                "recovered": 1.0 if served else 0.0,
                "recovery_s": recovery,
            }
        finally:
            factory.cleanup()


def _first_answer(server: ServerProcess, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            client = RawClient(server.socket_path, "after")
        except (OSError, ConnectionError):
            time.sleep(0.05)  # a bounded retry interval of the driver
            continue
        try:
            client.sock.settimeout(max(0.1, deadline - time.monotonic()))
            return client.request("server.status").outcome == "accepted"
        except (OSError, ConnectionError):
            continue
        finally:
            client.close()
    return False


def measure_slow_reader(flood_s: float, runs: int) -> dict[str, dict[str, float]]:
    """Latency of one client's ``server.status`` on a quiet server and beside a non-reader.

    The database holds ``runs`` completed runs (cloned from a real one), so each ``run.list``
    of the flood answers a page of 500 runs.
    """
    with tempfile.TemporaryDirectory(prefix="pwh", dir="/tmp") as root:
        (Path(root) / "t").mkdir()
        template = build_template(Path(root) / "t")
        seed_database(template, Path(root) / "h" / "state.sqlite", terminal=runs, resumable=0)
        factory = ServerFactory(Path(root) / "h")
        try:
            server = _server(factory, {})
            quiet = _latencies(server, flood_s)
            stop = threading.Event()
            cut_off = [0]
            hog = threading.Thread(target=_flood, args=(server, stop, cut_off), daemon=True)
            hog.start()
            try:
                busy = _latencies(server, flood_s)
            finally:
                stop.set()
                hog.join(timeout=30)
            return {
                "quiet": _summary(quiet),
                "flooded": {**_summary(busy), "hog_cut_off": float(cut_off[0])},
            }
        finally:
            factory.cleanup()


def _latencies(server: ServerProcess, duration_s: float) -> list[float]:
    samples: list[float] = []
    client = RawClient(server.socket_path, "victim")
    try:
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            started = time.perf_counter()
            response = client.request("server.status")
            samples.append(time.perf_counter() - started)
            if response.outcome != "accepted":
                raise SystemExit(f"server.status answered {response.outcome}")
    finally:
        client.close()
    return samples


def _flood(server: ServerProcess, stop: threading.Event, cut_off: list[int]) -> None:
    frames = b"".join((_STATUS % i) + (_LIST % i) for i in range(1_000))
    while not stop.is_set():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(1.0)
        try:
            sock.connect(str(server.socket_path))
            while not stop.is_set():
                try:
                    sock.sendall(frames)
                except TimeoutError:
                    continue  # the server stopped reading us: backpressure works
        except (BrokenPipeError, ConnectionResetError):
            cut_off[0] += 1
        finally:
            sock.close()


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": float(len(samples)),
        "p50_ms": 1000 * statistics.median(samples),
        "p99_ms": 1000 * percentile(samples, 99),
        "max_ms": 1000 * max(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.hostile_clients")
    parser.add_argument("figure", choices=("emfile", "slow-reader", "all"), default="all")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds held at EMFILE")
    parser.add_argument("--flood", type=float, default=10.0, help="seconds of flooding")
    parser.add_argument("--runs", type=int, default=1000, help="runs in the flooded database")
    args = parser.parse_args()
    if args.figure in ("emfile", "all"):
        figures = measure_emfile(args.hold)
        print("EMFILE (busy connections, one waiting in the backlog)")
        for key, value in figures.items():
            print(f"  {key:>18}: {value:,.3f}")
    if args.figure in ("slow-reader", "all"):
        latency = measure_slow_reader(args.flood, args.runs)
        print("other client's server.status latency")
        for phase, values in latency.items():
            shown = ", ".join(f"{key} {value:,.1f}" for key, value in values.items())
            print(f"  {phase:>8}: {shown}")


if __name__ == "__main__":
    main()
