"""Hostile clients of the metrics endpoint: idle TCP connections must not starve a scrape
(`kiln monitor` on loopback, no GPU needed: it serves kiln's own metrics)."""
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402


def _scrape(port, timeout):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data.decode(errors="replace")
            data += chunk


def _start_monitor(h):
    p = subprocess.Popen([h.kiln, "monitor", "--metrics-port", "0", "--metrics-bind", "127.0.0.1",
                          "--duration", "60s", "--nvml-library", "/nonexistent/libnvml.so"],
                         cwd=h.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    line = p.stdout.readline().decode()  # "kiln monitor: serving http://127.0.0.1:PORT/metrics"
    if "serving" not in line:
        p.kill()
        raise hostile.CaseFailure("monitor did not start: %r %r" % (line, p.stderr.read()[-2000:]))
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    return p, port


def _stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise hostile.CaseFailure("monitor did not stop on SIGTERM within 10 s")


def _idle_then_scrape(h, n_idle, bound_s):
    p, port = _start_monitor(h)
    idle = []
    try:
        for _ in range(n_idle):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.2)
        start = time.monotonic()
        body = _scrape(port, timeout=bound_s + 5)
        took = time.monotonic() - start
        if "kiln_up" not in body:
            raise hostile.CaseFailure("scrape with %d idle clients got no metrics: %r" % (
                n_idle, body[-500:]))
        if took > bound_s:
            raise hostile.CaseFailure("scrape with %d idle clients took %.1f s (bound %s s)" % (
                n_idle, took, bound_s))
    finally:
        for s in idle:
            s.close()
        _stop(p)
    if p.returncode != 0:
        raise hostile.CaseFailure("monitor exited %s after SIGTERM" % p.returncode)


def case_eight_idle_clients(h):
    _idle_then_scrape(h, 8, bound_s=2)


def case_many_idle_clients(h):
    # One event loop serves every connection: 40 silent clients (each dropped after the 3 s I/O
    # bound) cost sockets, not workers, and the scrape is answered at once.
    _idle_then_scrape(h, 40, bound_s=2)


if __name__ == "__main__":
    hostile.main(globals())
