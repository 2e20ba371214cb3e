#!/usr/bin/python3
"""Observability acceptance on a local fleet (`baton up`, 4 workers):

1. A real Prometheus (Debian's `prometheus`) scrapes the controller and every
   worker during a job; PromQL over its HTTP API returns the job's step count
   and the workers' comm bytes, equal to what `baton status` says.
2. Headless Chromium loads the status page during the job
   (tests/browser/status_page_check.py): screenshot, fleet table, the step
   count increasing between two loads, no request outside the controller.
3. `baton run` under a pseudo-terminal (`script`) draws a progress bar;
   piped, it prints plain lines.
4. A gRPC client that is not ours (python3-grpcio) gets SERVING from both
   daemons' grpc.health.v1.

Usage: observability_test.py BATON CONTROLLER_BIN WORKER_BIN EXAMPLE_JOB STATUS_PAGE_CHECK
Every process it starts is ended by pid; every wait is bounded.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

DEADLINE = time.time() + 480  # the whole test
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def summary(test):
    """The exit status of `test` from the checks made: 0 when all passed."""
    if failures:
        print("\n%s: %d check(s) FAILED" % (test, len(failures)))
        return 1
    print("\n%s: all checks passed" % test)
    return 0


def remaining(limit):
    return max(1.0, min(limit, DEADLINE - time.time()))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


class Fleet:
    """`baton up` (4 workers unless told) with HTTP on; stopped by pid."""

    def __init__(self, baton, controller_bin, worker_bin, tmp, workers=4, extra=()):
        self.baton = baton
        self.env = dict(os.environ, BATON_TOKEN_FILE=os.path.join(tmp, "client.token"))
        addr_file = os.path.join(tmp, "controller.addr")
        self.log = open(os.path.join(tmp, "up.log"), "w")
        self.proc = subprocess.Popen(
            [baton, "up", "--workers=%d" % workers, "--http_port=0", "--address_file=" + addr_file,
             "--controller_bin=" + controller_bin, "--worker_bin=" + worker_bin, *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        while not os.path.exists(addr_file) or not open(addr_file).read():
            if self.proc.poll() is not None or time.time() > DEADLINE:
                raise RuntimeError("baton up did not start; see " + self.log.name)
            time.sleep(0.1)
        self.address = open(addr_file).read().strip()

    def cli(self, *args, timeout=60):
        return subprocess.run([self.baton, *args, "--controller=" + self.address], env=self.env,
                              capture_output=True, text=True, timeout=remaining(timeout))

    def status(self):
        r = self.cli("status", "--output=json", timeout=20)
        if r.returncode != 0:
            raise RuntimeError("baton status failed: " + r.stderr)
        return json.loads(r.stdout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def field(msg, *names):
    """A JSON field under either proto JSON spelling (snake or lowerCamel)."""
    for n in names:
        if n in msg:
            return msg[n]
    return None


def job_file(example, tmp, steps, name):
    text = open(example).read()
    text = re.sub(r"(?m)^steps:\s*\d+", "steps: %d" % steps, text)
    text = re.sub(r'(?m)^name:\s*"[^"]*"', 'name: "%s"' % name, text)
    path = os.path.join(tmp, name + ".textproto")
    open(path, "w").write(text)
    return path


def start_job(fleet, path, log_path, *flags):
    log = open(log_path, "w")
    return subprocess.Popen([fleet.baton, "run", "--controller=" + fleet.address, *flags, path], stdout=log,
                            stderr=subprocess.STDOUT, env=fleet.env, start_new_session=True)


def stop_proc(p):
    if p is not None and p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def wait_job_running(fleet, at_least_step, run):
    while time.time() < DEADLINE:
        if run.poll() is not None:
            raise RuntimeError("baton run ended (exit %d) before step %d" % (run.returncode, at_least_step))
        jobs = fleet.status().get("jobs") or [{}]
        job = jobs[-1]
        if int(field(job, "step") or 0) >= at_least_step:
            return job
        time.sleep(0.2)
    raise RuntimeError("the job never reached step %d" % at_least_step)


def prometheus_part(fleet, tmp, example):
    prom = shutil.which("prometheus")
    if prom is None:
        check(False, "prometheus is installed (Debian's package; ./dev.sh installs it)")
        return
    status = fleet.status()
    targets = [field(status, "http_address", "httpAddress")]
    targets += [field(w, "http_address", "httpAddress") for w in status["workers"]]
    check(all(targets) and len(targets) == 5, "HTTP addresses: controller + 4 workers: %s" % targets)
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: baton\n    static_configs:\n      - targets: [%s]\n"
                % ", ".join("'%s'" % t for t in targets))
    port = free_port()
    log = open(os.path.join(tmp, "prometheus.log"), "w")
    p = subprocess.Popen([prom, "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                          "--web.listen-address=127.0.0.1:%d" % port],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        api = "http://127.0.0.1:%d/api/v1/" % port

        def query(q):
            body = json.loads(http_get(api + "query?" + urllib.parse.urlencode({"query": q})))
            return body["data"]["result"]

        # Prometheus up and every target scraped.
        up = []
        while time.time() < DEADLINE:
            try:
                up = query("up == 1")
                if len(up) == 5:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        check(len(up) == 5, "Prometheus scrapes 5 targets (up == 1: %d)" % len(up))
        # One step per RunStep call, so that the workers' RPC count is exactly
        # 4 x steps (by default the controller puts many steps in one call).
        job = start_job(fleet, job_file(example, tmp, 20, "prometheus_job"), os.path.join(tmp, "prom_job.log"),
                        "--steps_per_call=1")
        try:
            job.wait(timeout=remaining(180))
        finally:
            stop_proc(job)
        check(job.returncode == 0, "the 20-step job ran (exit %s)" % job.returncode)
        st = fleet.status()["jobs"][-1]
        job_id = field(st, "job_id", "jobId")
        step = int(field(st, "step"))
        comm = int(field(st, "comm_bytes_total", "commBytesTotal") or 0)
        # Wait for a scrape after the job finished: values equal to the status.
        got_step = got_comm = None
        while time.time() < DEADLINE:
            s = query('baton_job_step{job_id="%s"}' % job_id)
            c = query('sum(baton_comm_bytes_total{job_id="%s"})' % job_id)
            got_step = int(float(s[0]["value"][1])) if s else None
            got_comm = int(float(c[0]["value"][1])) if c else None
            if got_step == step and got_comm == comm:
                break
            time.sleep(0.5)
        check(got_step == step, "PromQL baton_job_step{job_id=\"%s\"} = %s; baton status says step %d" %
              (job_id, got_step, step))
        check(got_comm == comm and comm > 0,
              "PromQL sum(baton_comm_bytes_total{job_id=\"%s\"}) over the 4 workers = %s; baton status says %d bytes"
              % (job_id, got_comm, comm))
        by = query('sum by (collective) (baton_comm_bytes_total{job_id="%s"})' % job_id)
        print("      comm bytes by collective: " +
              ", ".join("%s=%s" % (r["metric"].get("collective"), r["value"][1]) for r in by))
        hist = query('sum(baton_step_duration_seconds_count{job_id="%s"})' % job_id)
        check(bool(hist) and int(float(hist[0]["value"][1])) == step,
              "baton_step_duration_seconds_count = %s steps" % (hist[0]["value"][1] if hist else None))
        rpc = query('sum(baton_rpc_duration_seconds_count{method="/baton.v1.Worker/RunStep"})')
        by_transport = query('sum by (transport) (baton_rpc_duration_seconds_count{method="/baton.v1.Worker/RunStep"})')
        check(bool(rpc) and int(float(rpc[0]["value"][1])) == 4 * step,
              "RunStep calls timed on the workers: %s (4 x %d; by transport: %s)" %
              (rpc[0]["value"][1] if rpc else None, step,
               ", ".join("%s=%s" % (r["metric"].get("transport"), r["value"][1]) for r in by_transport)))
        over_channel = [int(float(r["value"][1])) for r in by_transport
                        if r["metric"].get("transport") == "step_channel"]
        check(over_channel == [4 * step], "RunStep calls over the workers' step channels (their default without TLS): "
              "%s of %d" % (over_channel, 4 * step))
    finally:
        stop_proc(p)


def browser_part(fleet, tmp, example, page_check):
    status = fleet.status()
    url = "http://%s/" % field(status, "http_address", "httpAddress")
    job = start_job(fleet, job_file(example, tmp, 2000, "browser_job"), os.path.join(tmp, "browser_job.log"))
    try:
        wait_job_running(fleet, 2, job)
        out = os.path.join(tmp, "browser")
        r = subprocess.run(["/usr/bin/python3", page_check, "--url", url, "--out", out, "--workers", "4"],
                           capture_output=True, text=True, timeout=remaining(180))
        print(r.stdout + r.stderr)
        check(r.returncode == 0, "status page check in headless Chromium (exit %d)" % r.returncode)
        shot = os.path.join(out, "status_page.png")
        undeclared = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
        if os.path.exists(shot) and undeclared:
            shutil.copy(shot, undeclared)
            print("      screenshot kept as status_page.png in the test's outputs")
    finally:
        stop_proc(job)  # `baton run` stops its job on SIGTERM


def terminal_part(fleet, tmp, example):
    path = job_file(example, tmp, 6, "terminal_job")
    cmd = "%s run --controller=%s %s" % (fleet.baton, fleet.address, path)
    # Bytes, not text: universal newlines would turn the bar's \r into \n.
    tty = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, env=fleet.env,
                         timeout=remaining(120))
    tty_out = tty.stdout.decode(errors="replace")
    bars = re.findall(r"\r\x1b\[K\[[=> ]+\] step (\d+)/6  loss [0-9.]+  tokens/s \d+  ETA [0-9.]+s", tty_out)
    check(tty.returncode == 0 and bars and bars[-1] == "6",
          "under a pseudo-terminal: %d progress bar frames, the last at step %s/6" % (len(bars), bars[-1] if bars else "-"))
    if not bars:
        print("      script exit %d; its output ends: %r" % (tty.returncode, tty_out[-600:]))
    else:
        print("      last frame: %r" % re.findall(r"\r\x1b\[K(\[[^\r]*)", tty_out)[-1])
    piped = subprocess.run([fleet.baton, "run", "--controller=" + fleet.address, path], capture_output=True,
                           env=fleet.env, timeout=remaining(120))
    piped_out = piped.stdout.decode(errors="replace")
    lines = [l for l in piped_out.split("\n") if l.startswith("step ")]
    check(piped.returncode == 0 and "\r" not in piped_out and "\x1b" not in piped_out and len(lines) == 6,
          "piped: %d plain step lines, no carriage returns or escapes" % len(lines))


def health_part(fleet):
    try:
        import grpc
    except ImportError:
        check(False, "python3-grpcio is installed")
        return
    status = fleet.status()
    targets = {"controller": fleet.address}
    for w in status["workers"]:
        targets[w["name"]] = w["address"]
    for name, address in sorted(targets.items()):
        with grpc.insecure_channel(address) as channel:
            # grpc.health.v1.Health/Check with an empty HealthCheckRequest; the
            # answer is field 1 (status) as a varint: 1 = SERVING.
            check_rpc = channel.unary_unary("/grpc.health.v1.Health/Check",
                                            request_serializer=lambda b: b, response_deserializer=lambda b: b)
            answer = check_rpc(b"", timeout=5)
        check(answer == b"\x08\x01", "python3-grpcio health check of %s (%s): %s" %
              (name, address, "SERVING" if answer == b"\x08\x01" else repr(answer)))


def main():
    baton, controller_bin, worker_bin, example, page_check = [os.path.abspath(a) for a in sys.argv[1:6]]
    tmp = tempfile.mkdtemp(prefix="observability-", dir=os.environ.get("TEST_TMPDIR"))
    fleet = None
    try:
        fleet = Fleet(baton, controller_bin, worker_bin, tmp)
        print("fleet at %s" % fleet.address, flush=True)
        health_part(fleet)
        prometheus_part(fleet, tmp, example)
        terminal_part(fleet, tmp, example)
        if shutil.which("chromium") or os.path.exists("/usr/bin/chromium"):
            browser_part(fleet, tmp, example, page_check)
        else:
            check(False, "chromium is installed (Debian's package; ./dev.sh installs it)")
    finally:
        if fleet is not None:
            fleet.stop()
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
