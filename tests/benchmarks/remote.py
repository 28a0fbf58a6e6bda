"""``make bench-remote``: stores on object storage with latency, next to the same
stores on local disk, in one run.

A local S3 server (moto) sits behind a small HTTP proxy that holds every
request for ``--latency-ms`` before forwarding it, as a far-away object store
would. Each format's ``make bench`` store is converted locally, uploaded, and
read for whole shuffled epochs by ``tf_dataset`` from local disk and from
``s3://`` (each in its own process); converting to ``s3://`` is timed too.
Data files hold 2 MiB each (``PART_BYTES``), on disk and on S3 alike: moto
reads a whole object to serve a ranged request, so big objects would measure
moto, not the reader.

    python -m tests.benchmarks.remote --latency-ms 20
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.benchmarks.benchmark import BATCH, OUT, _make_throughput_data

# small data files: the local S3 server (moto) copies a whole object to serve a range
PART_BYTES = 2 << 20
EPOCHS = 3  # read per measurement (the first one warms up)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate"}


def latency_proxy(upstream_port: int, delay: float) -> ThreadingHTTPServer:
    """An HTTP proxy on 127.0.0.1 that waits ``delay`` seconds per request, then
    forwards it to ``127.0.0.1:upstream_port`` (started in a thread); its
    ``counts`` say how many requests it served and how many bytes it sent."""
    counts = {"requests": 0, "bytes": 0}
    counts_lock = threading.Lock()

    class Delayed(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            time.sleep(delay)
            body = self._body()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            upstream.request(self.command, self.path, body=body, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
            self.send_response(reply.status, reply.reason)
            for key, value in reply.getheaders():
                if key.lower() not in _HOP_BY_HOP and (
                        key.lower() != "content-length" or self.command == "HEAD"):
                    self.send_header(key, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            upstream.close()
            with counts_lock:
                counts["requests"] += 1
                counts["bytes"] += len(data) if self.command == "GET" else 0

        def _body(self) -> bytes | None:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                parts: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline().strip():
                            pass  # trailers
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else None

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815 (http.server names)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Delayed)
    server.daemon_threads = True
    server.counts = counts  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(port: int, seconds: float = 30.0) -> None:
    """Until something listens on ``127.0.0.1:port``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"the local S3 server did not start on port {port}")


def child_epoch(store: str) -> dict[str, Any]:
    """Windows/s of whole shuffled ``tf_dataset`` epochs (the best of 2, after one)."""
    import windowkit as wk

    opened = wk.open_store(store)
    ds = opened.tf_dataset("train", BATCH, seed=0)
    best = 0.0
    for epoch in range(EPOCHS):
        windows, start = 0, time.perf_counter()
        for batch in ds:
            windows += int(batch[0].shape[0] if isinstance(batch, tuple) else batch.shape[0])
        if epoch:
            best = max(best, windows / (time.perf_counter() - start))
    return {"windows_per_s": best}


def child_convert(source: str, out: str, fmt: str) -> dict[str, Any]:
    import windowkit as wk

    start = time.perf_counter()
    wk.convert(source, out, format=fmt, window=32, overwrite=True, part_size=PART_BYTES)
    return {"seconds": time.perf_counter() - start}


def _child(env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "tests.benchmarks.remote", "child", *args],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child {args} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run(latency_ms: float, formats: list[str]) -> None:
    import logging

    import fsspec

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()  # the S3 server in a process of its own (the proxy has this one)
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    _wait_for(port)
    proxy = latency_proxy(port, latency_ms / 1000)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.server_port}",
           "WINDOWKIT_CACHE": str(OUT / "remote-cache")}
    os.environ.update({k: env[k] for k in env if k.startswith("AWS_")})
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"  # uploads skip the delay
    try:
        source_dir = OUT / "throughput-src"
        _make_throughput_data(source_dir)
        fs = fsspec.filesystem("s3")
        fs.mkdir("bench")
        print(f"data: the make bench data, tf_dataset whole shuffled epochs; object store: "
              f"local S3 server + {latency_ms:g} ms per request")
        print(f"{'format':<10}{'local w/s':>14}{'s3 w/s':>14}{'s3/local':>10}"
              f"{'convert local':>15}{'convert s3':>12}{'requests/epoch':>16}"
              f"{'MB/epoch':>10}")
        for fmt in formats:
            local = OUT / f"remote-local-{fmt}"
            sources = str(source_dir / "*.npy")
            local_convert = _child(env, "convert", sources, str(local), fmt)["seconds"]
            remote_convert = _child(env, "convert", sources, f"s3://bench/{fmt}", fmt)["seconds"]
            on_disk = _child(env, "epoch", str(local))["windows_per_s"]
            before = dict(proxy.counts)  # type: ignore[attr-defined]
            on_s3 = _child(env, "epoch", f"s3://bench/{fmt}")["windows_per_s"]
            requests, sent = (proxy.counts[k] - before[k]  # type: ignore[attr-defined]
                              for k in ("requests", "bytes"))
            print(f"{fmt:<10}{on_disk:>14,.0f}{on_s3:>14,.0f}{on_s3 / on_disk:>9.2f}x"
                  f"{local_convert:>14.1f}s{remote_convert:>11.1f}s"
                  f"{requests / EPOCHS:>16,.0f}{sent / EPOCHS / 1e6:>10.1f}", flush=True)
    finally:
        proxy.shutdown()
        server.terminate()
        server.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.remote")
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("child")
    child.add_argument("name", choices=["epoch", "convert"])
    child.add_argument("args", nargs="*")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--formats", nargs="+", default=["tfrecord", "zarr", "parquet"])
    args = parser.parse_args(argv)
    if args.command == "child":
        function = child_epoch if args.name == "epoch" else child_convert
        print(json.dumps(function(*args.args)))
        return
    Path(OUT).mkdir(parents=True, exist_ok=True)
    run(args.latency_ms, args.formats)


if __name__ == "__main__":
    main()
