#!/usr/bin/python3
"""A stand-in controller for checking controller/status_page.html without a cluster.

Serves the page at / and a made-up GET /api/status (protobuf JSON mapping,
snake_case names, int64 as strings) with N workers and a running job whose
step advances with wall time. Stdlib only; for development and the browser
check's self-test:

  tests/browser/fake_status_server.py --port 0 --workers 4 &
  # prints: listening on http://127.0.0.1:PORT/
  tests/browser/status_page_check.py --url http://127.0.0.1:PORT/ --out /tmp/out --workers 4

Every request it answers is logged to stderr, so a stray request shows here too.
"""

import argparse
import http.server
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HTML = os.path.join(HERE, "..", "..", "controller", "status_page.html")


class State:
    def __init__(self, workers, steps_per_s, total_steps, dead_rank=-1):
        self.t0 = time.time()
        self.dead_rank = dead_rank
        self.workers = workers
        self.steps_per_s = steps_per_s
        self.total_steps = total_steps

    def status(self):
        now = time.time()
        step = min(self.total_steps, int((now - self.t0) * self.steps_per_s) + 3)
        names = ["worker-%d" % i for i in range(self.workers)]
        workers = []
        for i, name in enumerate(names):
            dead = i == self.dead_rank
            workers.append({
                "name": name,
                "address": "127.0.0.1:%d" % (50051 + i),
                "pid": str(4000 + i),
                "devices": [{"kind": "cpu", "index": 0, "description": "cpu"}],
                "rank": i,
                "state": "DEAD" if dead else "RUNNING",
                "heartbeat_age_s": 7.5 if dead else round((now * 3 + i * 0.37) % 1.0, 3),
                "incarnation": "inc-%d" % i,
                "memory_bytes": str((16 + 4 * i) * 1024 ** 3),
                "cpu_cores": 8,
            })
        tp = 2 if self.workers % 2 == 0 and self.workers > 1 else 1
        dp = self.workers // tp
        history = []
        for s in range(max(1, step - 999), step + 1):
            loss = 2.0 + 8.0 * math.exp(-s / 60.0) + 0.15 * math.sin(s * 0.9)
            history.append({
                "step": s, "loss": loss, "tokens_per_s": 5200.0 + 40 * math.sin(s),
                "step_ms": 98.0 + 3 * math.cos(s), "comm_bytes": "1048576",
                "state_bytes": "33554432", "tokens": "512", "has_loss": True,
            })
        events = [
            {"sequence": str(i + 1), "time_unix_ms": str(int((self.t0 - 30 + i) * 1000)),
             "kind": "WORKER_REGISTERED", "worker": n, "rank": i,
             "detail": "at 127.0.0.1:%d" % (50051 + i)}
            for i, n in enumerate(names)
        ]
        events.append({"sequence": str(len(events) + 1),
                       "time_unix_ms": str(int((self.t0 - 5) * 1000)),
                       "kind": "MESH_CREATED", "worker": "", "rank": -1, "mesh_id": "m-1",
                       "job_id": "job-1", "detail": "dp=%d,tp=%d" % (dp, tp)})
        # Markup in data must show as text, not become elements.
        events.append({"sequence": str(len(events) + 1),
                       "time_unix_ms": str(int(self.t0 * 1000)),
                       "kind": "JOB_STARTED", "worker": "", "rank": -1, "job_id": "job-1",
                       "detail": "job <b>demo</b> & <img src=x> started"})
        return {
            "workers": workers,
            "meshes": [{"mesh_id": "m-1", "epoch": "1", "job_id": "job-1",
                        "axes": [{"name": "dp", "size": dp}, {"name": "tp", "size": tp}],
                        "worker_names": names,
                        "worker_addresses": [w["address"] for w in workers]}],
            "heartbeat_timeout_ms": "3000",
            "jobs": [{"job_id": "job-1", "name": "demo <llama>", "state":
                      "JOB_RUNNING" if step < self.total_steps else "JOB_FINISHED",
                      "step": step, "steps": self.total_steps, "error": "", "detached": True,
                      "mesh_id": "m-1", "workers": names, "last": history[-1], "start_step": 0}],
            "histories": [{"job_id": "job-1", "steps": history}],
            "events": events[-50:],
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: any free port")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps-per-s", type=float, default=2.0)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--dead-rank", type=int, default=-1, help="show this rank as DEAD")
    ap.add_argument("--html", default=DEFAULT_HTML)
    ap.add_argument("--leaky", action="store_true",
                    help="serve the page with references to foreign origins "
                         "(the browser check's network assertion must then fail)")
    args = ap.parse_args()

    with open(args.html, "rb") as f:
        page = f.read()
    if args.leaky:
        page = page.replace(b"</head>", b"""<script>fetch("https://api.example.net/v1").catch(function () {});</script>
</head>""", 1).replace(b"</body>", b'<img src="http://images.example.org/x.png" alt=""></body>', 1)
    state = State(args.workers, args.steps_per_s, args.steps, args.dead_rank)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self.reply(200, "text/html; charset=utf-8", page)
            elif path == "/api/status":
                body = json.dumps(state.status()).encode()
                self.reply(200, "application/json", body)
            else:
                self.reply(404, "text/plain", b"not found\n")

        def reply(self, code, ctype, body):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *a):
            sys.stderr.write("fake_status_server: %s\n" % (fmt % a))

    srv = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    print("listening on http://%s:%d/" % (args.host, srv.server_address[1]), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
