#!/usr/bin/python3
"""Hostile clients against a local fleet (`baton up`, 2 workers, HTTP on):

1. A gRPC client that is not ours (python3-grpcio) with a valid token sends
   Step, StopJob and ListJobs for a 15 MiB job id of NUL bytes: each is
   answered within 1 s, with a bounded message. So is a worker's ReadPieces
   (GetRetained, ReleaseState) for that id, sent with the fleet's worker
   token.
2. `baton plan` of /dev/zero, of a FIFO and of a 5 MiB file: refused within
   1 s each.
3. 576 slow HTTP connections (a header byte every 2 s) held for 30 s, 64
   from each of 127.0.0.1 to 127.0.0.9, while /api/status is probed from
   127.0.0.10 every 0.5 s: every probe is answered.
4. A job named with terminal escapes, CR and LF: `baton jobs`, `baton status`
   and `baton watch` print it escaped (no raw control byte reaches the
   terminal).
5. The directory of an earlier `baton up` that was SIGKILLed (its tokens
   left behind) is removed when the next one starts.

Usage: hostile_test.py BATON CONTROLLER_BIN WORKER_BIN EXAMPLE_JOB
Every process it starts is ended by pid; every wait is bounded.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from observability_test import Fleet, check, field, summary  # noqa: E402

SLOW_ADDRESSES = 9
SLOW_PER_ADDRESS = 64
SLOW_CONNECTIONS = SLOW_ADDRESSES * SLOW_PER_ADDRESS
SLOW_SECONDS = 30


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def string_field(number, value):
    return varint(number << 3 | 2) + varint(len(value)) + value


HUGE_ID = b"\0" * (15 << 20)
GRPC_OPTIONS = [("grpc.max_send_message_length", 32 << 20), ("grpc.max_receive_message_length", 32 << 20)]


def check_huge_id(channel, service, method, metadata, label):
    """Sends `method` a 15 MiB job id of NULs: answered within 1 s, INVALID_ARGUMENT, a bounded message."""
    import grpc
    kind = channel.unary_stream if method == "StepStream" else channel.unary_unary
    rpc = kind("/baton.v1.%s/%s" % (service, method), request_serializer=lambda b: b,
               response_deserializer=lambda b: b)
    start = time.time()
    try:
        answer = rpc(string_field(1, HUGE_ID), timeout=10, metadata=metadata)
        if method == "StepStream":
            list(answer)
        code, message = "OK", ""
    except grpc.RpcError as e:
        code, message = e.code().name, e.details() or ""
    took = time.time() - start
    check(took < 1.0 and code == "INVALID_ARGUMENT" and len(message) < 512,
          "%s%s with a 15 MiB job id of NULs: %s in %.3f s, message of %d bytes: %r"
          % (label, method, code, took, len(message), message[:160]))


def grpc_part(fleet):
    import grpc
    token = open(fleet.env["BATON_TOKEN_FILE"]).read().strip()
    with grpc.insecure_channel(fleet.address, options=GRPC_OPTIONS) as channel:
        for method in ("Step", "StepStream", "StopJob", "ListJobs", "KeepAlive"):
            check_huge_id(channel, "Controller", method, [("authorization", "Bearer " + token)], "")


def worker_part(fleet):
    import grpc
    token_line = [l for l in open(fleet.log.name).read().splitlines() if l.startswith("worker token: ")]
    check(bool(token_line), "baton up printed where the worker token is")
    if not token_line:
        return
    token = open(token_line[0].split()[2]).read().strip()
    worker = fleet.status()["workers"][0]
    name, address = worker["name"], worker["address"]
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        for method in ("ReadPieces", "GetRetained", "ReleaseState"):
            check_huge_id(channel, "Worker", method,
                          [("authorization", "Bearer " + token), ("x-baton-worker", name)], "worker %s " % name)


def plan_part(fleet, tmp):
    fifo = os.path.join(tmp, "job.fifo")
    os.mkfifo(fifo)
    big = os.path.join(tmp, "big.textproto")
    with open(big, "w") as f:
        f.write("# " + "x" * (5 << 20) + "\n")
    for path in ("/dev/zero", fifo, big):
        start = time.time()
        r = subprocess.run([fleet.baton, "plan", path], capture_output=True, text=True, timeout=20, env=fleet.env)
        took = time.time() - start
        check(r.returncode == 2 and took < 1.0 and "regular file" in r.stderr,
              "baton plan %s: exit %d in %.3f s: %s" % (path, r.returncode, took, r.stderr.strip()[:200]))


def http_part(fleet):
    host, port = field(fleet.status(), "http_address", "httpAddress").rsplit(":", 1)
    port = int(port)
    stop = threading.Event()
    opened = []

    def slowloris():
        socks = []
        for i in range(SLOW_CONNECTIONS):
            source = "127.0.0.%d" % (1 + i % SLOW_ADDRESSES)
            try:
                s = socket.create_connection((host, port), timeout=5, source_address=(source, 0))
                s.sendall(b"GET /api/status HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
            except OSError:
                pass
        opened.append(len(socks))
        while not stop.wait(2.0):
            for s in list(socks):
                try:
                    s.sendall(b"X")
                except OSError:
                    socks.remove(s)
        opened.append(len(socks))  # still open at the end
        for s in socks:
            s.close()

    attacker = threading.Thread(target=slowloris)
    attacker.start()
    answered, probes, slowest = 0, 0, 0.0
    end = time.time() + SLOW_SECONDS
    import http.client
    while time.time() < end:
        probes += 1
        start = time.time()
        try:
            c = http.client.HTTPConnection(host, port, timeout=5, source_address=("127.0.0.10", 0))
            c.request("GET", "/api/status")
            r = c.getresponse()
            body = r.read()
            if r.status == 200 and json.loads(body).get("workers"):
                answered += 1
            c.close()
        except (OSError, ValueError) as e:
            print("      probe failed: %s" % e, flush=True)
        slowest = max(slowest, time.time() - start)
        time.sleep(0.5)
    stop.set()
    attacker.join()
    check(answered == probes and probes >= 30,
          "%d slow HTTP connections from %d addresses (%d connected, %d still held by the server after %d s: the "
          "per-client bounds) while /api/status was probed from 127.0.0.10: %d of %d probes answered, the slowest "
          "in %.3f s" % (SLOW_CONNECTIONS, SLOW_ADDRESSES, opened[0] if opened else 0, opened[-1] if opened else 0,
                         SLOW_SECONDS, answered, probes, slowest))


def names_part(fleet, tmp, example):
    text = open(example).read()
    evil = "evil\\x1b[2J\\r\\nname\\x07"
    lines = [('name: "%s"' % evil) if l.startswith("name:") else l for l in text.splitlines()]
    lines = ["steps: 2" if l.startswith("steps:") else l for l in lines]
    path = os.path.join(tmp, "evil.textproto")
    open(path, "w").write("\n".join(lines) + "\n")
    r = fleet.cli("submit", path, timeout=60)
    check(r.returncode == 0, "a job named with escapes submitted: %s" % (r.stdout.strip() or r.stderr.strip()))
    job = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    fleet.cli("logs", job, "--follow", timeout=120)
    for args in (("jobs",), ("status",), ("watch", "--seconds=1"), ("logs", job)):
        out = fleet.cli(*args, timeout=30)
        raw = [c for c in out.stdout if ord(c) < 0x20 and c not in "\n"]
        shown = [l for l in out.stdout.splitlines() if "evil" in l]
        check(out.returncode == 0 and not raw and shown and "\\x1b[2J\\r\\nname\\x07" in shown[0],
              "baton %s prints the name escaped, no raw control byte (%d raw): %s"
              % (args[0], len(raw), shown[0][:120] if shown else "(not shown)"))


def abandoned_up_dir():
    """A directory as a `baton up` SIGKILLed would leave it: its owner gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    root = os.environ.get("TEST_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    d = tempfile.mkdtemp(prefix="baton-up-", dir=root)
    with open(os.path.join(d, "owner.pid"), "w") as f:
        f.write("%d\n" % gone.pid)
    with open(os.path.join(d, "worker.token"), "w") as f:
        f.write("secret\n")
    return d


def main():
    baton, controller_bin, worker_bin, example = sys.argv[1:5]
    tmp = tempfile.mkdtemp(prefix="baton-hostile-")
    fleet = None
    try:
        left = abandoned_up_dir()
        fleet = Fleet(baton, controller_bin, worker_bin, tmp, workers=2)
        check(not os.path.exists(left),
              "the directory of a baton up whose process is gone (%s, with its worker.token) %s when the next "
              "started" % (os.path.basename(left), "still there" if os.path.exists(left) else "was removed"))
        grpc_part(fleet)
        worker_part(fleet)
        plan_part(fleet, tmp)
        http_part(fleet)
        names_part(fleet, tmp, example)
    finally:
        if fleet is not None:
            fleet.stop()
    return summary("hostile_test")


if __name__ == "__main__":
    sys.exit(main())
