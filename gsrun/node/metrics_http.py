"""The node daemon's Prometheus endpoint: every GPU of the node, with job labels.

At each scrape :class:`GpuCollector` yields :data:`gsrun.node.metrics.JOB_SERIES`
and :data:`~gsrun.node.metrics.GPU_SERIES` of the monitor's ``readings()`` (a
GPU no job holds has ``job_id=""``), ``gsrun_gpu_info{name}`` and the
``gsrun_exporter_*`` series (docs/ADMIN.md). At most 64 x (16 x 7 + 3) + 5
series (:data:`MAX_GPUS`, :data:`MAX_JOBS_PER_GPU`); its own registry.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
from contextlib import suppress
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Callable, Sequence
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from gsrun.base.errors import NodeError
from gsrun.base.ids import JOB_ID_RE
from gsrun.node.metrics import (GPU_SERIES, JOB_SERIES, WINDOW_HTTP, GpuReading, device_key, device_labels,
                                families, gpu_samples, job_samples)

MAX_GPUS = 64                 # GPUs (device_key) accepted per scrape
MAX_JOBS_PER_GPU = 16         # readings accepted per GPU per scrape
MAX_LABEL_CHARS = 256         # a longer uuid, name, user or MIG instance makes the reading "bad"
MAX_CONNECTIONS = 16          # scrapes served at once; more are closed unanswered
MAX_PER_ADDRESS = 4           # ... of them from one client address (a Prometheus server scrapes one at a time)
CONNECTION_TIMEOUT_S = 10.0   # a client silent this long is dropped
REQUEST_DEADLINE_S = 5.0      # a connection's whole life: a client trickling its headers is cut off


def admit(readings: Sequence) -> tuple[list[GpuReading], int, int]:
    """``readings`` -> (kept in order, over_cap count, bad count). Pure. Bad:
    not a :class:`GpuReading`, a job id not ``[0-9]{1,10}``, a gres index not
    0-65535 or None, a text over :data:`MAX_LABEL_CHARS` or with a NUL.
    Over cap: past :data:`MAX_GPUS` GPUs or :data:`MAX_JOBS_PER_GPU` per GPU."""
    kept: list[GpuReading] = []
    per_gpu: dict[tuple, int] = {}
    over = bad = 0
    for r in readings:
        if not _good(r):
            bad += 1
            continue
        key = device_key(r)
        n = per_gpu.get(key)
        if (n is None and len(per_gpu) >= MAX_GPUS) or (n is not None and n >= MAX_JOBS_PER_GPU):
            over += 1
            continue
        per_gpu[key] = (n or 0) + 1
        kept.append(r)
    return kept, over, bad


def _good(r) -> bool:
    if not isinstance(r, GpuReading):
        return False
    if r.job_id is not None and not (isinstance(r.job_id, str) and JOB_ID_RE.fullmatch(r.job_id)):
        return False
    if r.gres_index is not None and not (type(r.gres_index) is int and 0 <= r.gres_index <= 65535):
        return False
    return all(text is None or (isinstance(text, str) and len(text) <= MAX_LABEL_CHARS and "\0" not in text)
               for text in (r.uuid, r.name, r.mig_instance, r.user))


class GpuCollector:
    """A ``prometheus_client`` collector of the module doc's families;
    ``readings()`` runs in the HTTP threads at each scrape. Never raises: a
    failing ``readings()`` gives ``scrape_success 0`` and one stderr line per cause."""

    def __init__(self, readings: Callable[[], Sequence[GpuReading]], node: str, user_label: bool = True):
        from gsrun import __version__

        self.readings = readings
        self.node = node
        self.user_label = user_label
        self.version = __version__
        self.errors = 0
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def describe(self):
        """Nothing ahead of a scrape: registering never calls ``readings()``."""
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        fams: list = []
        over = bad = 0
        ok = 1
        try:
            got = self.readings()
            if not isinstance(got, (list, tuple)):
                raise TypeError(f"readings() returned {type(got).__name__}, not a list")
            kept, over, bad = admit(got)
            fams = self._gpu_families(kept, InfoMetricFamily)
        except Exception as e:  # noqa: BLE001 - a scrape answers with the exporter's own series
            ok, fams = 0, []
            with self._lock:
                self.errors += 1
                first = type(e).__name__ not in self._warned
                self._warned.add(type(e).__name__)
            if first:
                print(f"gsrun: daemon: metrics endpoint: readings failed: {type(e).__name__}: {e}\n"
                      "hint: the GPU series are left out of every scrape while this lasts; "
                      "gsrun_exporter_errors_total counts them", file=sys.stderr, flush=True)
        yield from fams
        info = InfoMetricFamily("gsrun_exporter", "gsrun's exporter: its version")
        info.add_metric([], {"version": str(self.version)})
        yield info
        yield GaugeMetricFamily("gsrun_exporter_scrape_success",
                                "1 when the monitor's readings answered at this scrape, else 0", value=ok)
        yield CounterMetricFamily("gsrun_exporter_errors_total",
                                  "Scrapes whose readings from the monitor failed, since the daemon started",
                                  value=self.errors)
        dropped = GaugeMetricFamily("gsrun_exporter_readings_dropped",
                                    "Readings left out at this scrape: over_cap (more than 64 GPUs or 16 jobs "
                                    "per GPU) or bad (a malformed job id, index or label)", labels=["cause"])
        dropped.add_metric(["over_cap"], over)
        dropped.add_metric(["bad"], bad)
        yield dropped

    def _gpu_families(self, kept: list[GpuReading], info_cls) -> list:
        fams = families(job_samples(kept, self.node, self.user_label), JOB_SERIES, WINDOW_HTTP, http=True)
        fams += families(gpu_samples(kept, self.node), GPU_SERIES, WINDOW_HTTP, http=True)
        info = info_cls("gsrun_gpu", "1 per GPU of the node: its model name")
        seen = set()
        for r in kept:
            if device_key(r) not in seen:
                seen.add(device_key(r))
                info.add_sample("gsrun_gpu_info", {**device_labels(r, self.node), "name": r.name or ""}, 1.0)
        if info.samples:
            fams.append(info)
        return fams


@dataclass
class Endpoint:
    """A running endpoint, ``address`` and ``port`` as bound."""

    address: str
    port: int
    httpd: WSGIServer
    thread: threading.Thread

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(timeout_s)
        self.httpd.server_close()


class _Handler(WSGIRequestHandler):
    """No access log (a scrape every 15 s is not news); a silent client is
    dropped after :data:`CONNECTION_TIMEOUT_S`."""

    timeout = CONNECTION_TIMEOUT_S

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per scrape, at most :data:`MAX_CONNECTIONS` at once and
    :data:`MAX_PER_ADDRESS` per client address (the rest closed unanswered);
    each connection is cut :data:`REQUEST_DEADLINE_S` after its accept,
    however slowly its client sends."""

    daemon_threads = True
    dual_stack = False
    request_queue_size = 64      # listen backlog (socketserver's 5 drops a burst's SYNs: 1-s retries)

    def __init__(self, *args, **kw):
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._per_address: dict[str, int] = {}
        self._lock = threading.Lock()
        super().__init__(*args, **kw)

    def _take(self, who: str) -> bool:
        with self._lock:
            if self._per_address.get(who, 0) >= MAX_PER_ADDRESS:
                return False
            self._per_address[who] = self._per_address.get(who, 0) + 1
            return True

    def _give(self, who: str) -> None:
        with self._lock:
            n = self._per_address.get(who, 1) - 1
            if n > 0:
                self._per_address[who] = n
            else:
                self._per_address.pop(who, None)

    def server_bind(self):
        if self.dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def process_request(self, request, client_address):
        who = str(client_address[0]) if client_address else ""
        if not self._take(who):
            self.shutdown_request(request)
            return
        if not self._slots.acquire(blocking=False):
            self._give(who)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._give(who)
            raise

    def process_request_thread(self, request, client_address):
        cut = threading.Timer(REQUEST_DEADLINE_S, _cut, (request,))
        cut.daemon = True
        cut.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            cut.cancel()
            self._slots.release()
            self._give(str(client_address[0]) if client_address else "")


def _cut(sock) -> None:
    """End a connection past its deadline (its thread's next read or write fails)."""
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _server_class(family: int, dual_stack: bool) -> type:
    return type("_Server", (_Server,), {"address_family": family, "dual_stack": dual_stack})


def _bind(address: str, port: int, app) -> WSGIServer:
    """A server bound to ``address``:``port``. ``""``: every address, IPv6
    and IPv4 (``::`` with IPV6_V6ONLY off), or every IPv4 address (``0.0.0.0``)
    where the host has no IPv6. Raises OSError (socket.gaierror for a name
    that does not resolve)."""
    from wsgiref.simple_server import make_server

    if address == "":
        try:
            return make_server("::", port, app, _server_class(socket.AF_INET6, True), handler_class=_Handler)
        except OSError as e:
            if e.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
        return make_server("0.0.0.0", port, app, _server_class(socket.AF_INET, False), handler_class=_Handler)
    family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    return make_server(sockaddr[0], port, app, _server_class(family, False), handler_class=_Handler)


def start_http(address: str, port: int, collector) -> Endpoint:
    """Serve ``collector`` on ``address``:``port`` from a daemon thread, every
    path (``make_wsgi_app``, with a connection limit and timeout).
    ``address``: ``""`` = every address, else an address or host name;
    ``port`` 0: any (tests).

    Raises:
        NodeError: the address cannot be bound: the port is in use (dcgm-exporter
            also listens on 9400), the address is not one of this host's, the
            name does not resolve, or a port below 1024 without root."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    shown = f"[{address}]:{port}" if ":" in address else f"{address or '*'}:{port}"
    try:
        httpd = _bind(address, port, make_wsgi_app(registry))
    except (OSError, UnicodeError) as e:
        detail = getattr(e, "strerror", None) or str(e)
        raise NodeError("daemon", "metrics endpoint", f"cannot listen on {shown}: {detail}",
                        hint="set [metrics] http_port to a free port (dcgm-exporter also uses 9400) and "
                             "http_address to one of this node's addresses, or http_port = 0 to turn the "
                             "endpoint off") from e
    bound = httpd.socket.getsockname()
    thread = threading.Thread(target=httpd.serve_forever, name="gsrun-metrics-http", daemon=True)
    thread.start()
    return Endpoint(str(bound[0]), int(bound[1]), httpd, thread)

