"""A GCS API server on localhost and a fault-injecting proxy in front of it, for tests and benchmarks.

`Emulator` runs `gcp-storage-emulator` (pure Python, in memory) in a subprocess on a free port with one bucket,
completed with the object generations and preconditions that Orbax's checkpoint format needs (emulator_server.py).
`FaultProxy` forwards every request to it (keeping the client's Host header, so resumable-upload URLs point back
at the proxy) after an optional fixed latency, and injects faults into requests that match a pattern:

| action | what the client sees |
| --- | --- |
| `503` / `429` | an error response with a JSON body, as GCS sends when overloaded |
| `drop` | the connection closes before any response |
| `cut` | a read gets its headers and half its body, then the connection closes; an upload is cut mid-body |
| `hold` | the request waits (not forwarded) until `release()`; `held` is set when one is waiting |

Clients reach the proxy (or the emulator) through `STORAGE_EMULATOR_HOST=<url>`; vit_jax derives the rest.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect", "proxy-connection"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Emulator:
    """gcp-storage-emulator on 127.0.0.1 with `bucket` created, in memory; `url` is its endpoint."""

    def __init__(self, bucket: str = "vit-jax-test", port: int = 0, log_path: str | None = None) -> None:
        import importlib.util

        if importlib.util.find_spec("gcp_storage_emulator") is None:
            raise RuntimeError("the GCS emulator is not installed: pip install gcp-storage-emulator (it comes with "
                               "vit_jax's test extra, `pip install -e '.[test]'`)")
        self.bucket = bucket
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path or os.devnull, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vit_jax.storage.emulator_server", "--port", str(self.port), "--bucket", bucket],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(timeout=60.0)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gcp-storage-emulator exited with code {self.proc.returncode} on port {self.port}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b/{self.bucket}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gcp-storage-emulator did not answer on {self.url} within {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> "Emulator":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclasses.dataclass
class Fault:
    action: str  # 503 | 429 | drop | cut | hold
    match: str = ""  # regex searched in "METHOD /path?query"
    count: int | None = 1  # matching requests that get the fault (None: every one, until cleared)
    after: int = 0  # matching requests let through before the first fault
    seen: int = 0
    injected: int = 0

    def take(self, line: str) -> bool:
        if self.count is not None and self.injected >= self.count or not re.search(self.match, line):
            return False
        self.seen += 1
        if self.seen <= self.after:
            return False
        self.injected += 1
        return True


class FaultProxy:
    """An HTTP proxy to `upstream` with `latency_s` added to every request and faults injected on demand."""

    def __init__(self, upstream: str, latency_s: float = 0.0, port: int = 0) -> None:
        host, _, port_text = upstream.split("://", 1)[1].partition(":")
        self.upstream = (host, int(port_text or 80))
        self.latency_s = latency_s
        self.requests = 0
        self.injected: dict[str, int] = {}
        self.log: list[str] = []  # "METHOD path" of every request, in arrival order
        self.uploads: list[str] = []  # names of the objects whose upload the server accepted, in order
        self.held = threading.Event()
        self._faults: list[Fault] = []
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def inject(self, action: str, match: str = "", count: int | None = 1, after: int = 0) -> Fault:
        if action not in ("503", "429", "drop", "cut", "hold"):
            raise ValueError(f"unknown fault {action!r}")
        fault = Fault(action, match, count, after)
        if action == "hold":
            self._release.clear()
            self.held.clear()
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        """Removes every fault, forgets how many were injected and lets held requests through."""
        with self._lock:
            self._faults = []
            self.injected = {}
        self.release()

    def release(self) -> None:
        self._release.set()

    def _take(self, line: str) -> str | None:
        with self._lock:
            self.requests += 1
            self.log.append(line)
            for fault in self._faults:
                if fault.take(line):
                    self.injected[fault.action] = self.injected.get(fault.action, 0) + 1
                    return fault.action
        return None

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _upload_name(method: str, path: str, body: bytes) -> str | None:
    """The object name a request starts uploading (a simple or multipart upload, or a resumable one's start)."""
    if method != "POST" or not path.startswith("/upload/") or "upload_id=" in path:
        return None
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    if "name" in query:
        return query["name"][0]
    m = re.search(rb'"name"\s*:\s*"([^"]+)"', body[:4096])
    return json.loads(b'"' + m.group(1) + b'"') if m else None


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # clients hang up: not news
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect; also answers `Expect: 100-continue`

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle + delayed ACKs add ~40 ms per request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

    def _read_body(self, limit: int | None = None) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
                if limit is not None and len(out) >= limit:
                    return bytes(out)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length if limit is None else min(length, limit))

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes, cut: bool = False) -> None:
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in HOP_HEADERS:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self._drop()
            return
        self.wfile.write(body)

    def _proxy(self) -> None:
        proxy: FaultProxy = self.server.proxy
        action = proxy._take(f"{self.command} {self.path}")
        if proxy.latency_s:
            time.sleep(proxy.latency_s)
        has_body = bool(self.headers.get("Content-Length") not in (None, "0")
                        or self.headers.get("Transfer-Encoding"))
        if action == "drop":
            self._drop()
            return
        if action == "cut" and has_body:
            self._read_body(limit=max(1, int(self.headers.get("Content-Length") or 2) // 2))
            self._drop()
            return
        body = self._read_body()
        if action in ("503", "429"):
            error = {"error": {"code": int(action), "message": "injected by FaultProxy", "errors": []}}
            self._send(int(action), [("Content-Type", "application/json")], json.dumps(error).encode())
            return
        if action == "hold":
            proxy.held.set()
            proxy._release.wait()
        conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            conn.request(self.command, self.path, body=body if has_body else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            name = _upload_name(self.command, self.path, body)
            if name and resp.status == 200:
                with proxy._lock:
                    proxy.uploads.append(name)
            self._send(resp.status, resp.getheaders(), data, cut=action == "cut")
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _proxy
