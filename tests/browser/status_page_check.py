#!/usr/bin/python3
"""Browser check of the controller's status page (controller/status_page.html).

  status_page_check.py --url http://HOST:PORT/ --out DIR [--workers N]
                       [--chromium /usr/bin/chromium]

Loads the page three times in headless Chromium, each run with a hard
timeout and a net log:
  1. --dump-dom: the fleet table must hold N `tr.worker` rows; #job-step read;
  2. after --wait seconds, --dump-dom again: #job-step must have increased;
  3. --screenshot=DIR/status_page.png at 1280x1000.
With --rank-chart N (a job that no longer steps: its figures stay put), load 1
must draw N bars in svg#rank-chart, each bar's compute, exposed communication
and idle equal to that rank's rank_times in /api/status (fetched beside it),
and the newest trace's link must name /api/status's newest_trace_job; load 2
then does not wait for the step to move.
Then every request in the three net logs is checked: whatever the page caused
must go to the page's own scheme://host:port (chrome:, data:, about:, blob:
and devtools: are ignored). Debian's Chromium also talks to Google on its own
(component updater, account lookup) even with --disable-background-networking;
those requests carry no initiator and a network isolation key that is not the
page's site, and are listed as browser-internal instead of failing the check.
A foreign origin that cannot be attributed either way fails the check.

Prints one line per figure checked; exits 1 on any failed check, 2 on a
usage or environment error. Stdlib only. Leaves no Chromium process behind:
each run gets its own session (killed as a group) and its own temporary
HOME, profile and crash database, and any process whose command line names
that directory is killed by pid afterwards (Chromium's crashpad handlers
detach into their own session).

Self-test without a cluster:
  tests/browser/fake_status_server.py --port 0 --workers 4 &   # prints its URL
  tests/browser/status_page_check.py --url http://127.0.0.1:PORT/ --out /tmp/sp --workers 4
  (fake_status_server.py --leaky makes the page fetch foreign origins: the
  network check must then fail.)
"""

import argparse
import html.parser
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link",
             "meta", "param", "source", "track", "wbr"}
IGNORED_SCHEMES = {"chrome", "chrome-untrusted", "data", "about", "blob", "devtools"}


class Failures:
    def __init__(self):
        self.failed = []

    def check(self, ok, what):
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            self.failed.append(what)
        return ok

    def info(self, what):
        print("      " + what, flush=True)


# ---------------------------------------------------------------- chromium runs

def _proc_sid(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        return fields[0], int(fields[3])  # state, session id
    except (OSError, ValueError, IndexError):
        return None, None


def _proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _leftovers(sid, marker):
    """Live processes of our run: in its session, or naming its temp dir."""
    found = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        state, psid = _proc_sid(pid)
        if state is None or state in ("Z", "X"):
            continue
        if psid == sid or marker in _proc_cmdline(pid):
            found.append(pid)
    return found


def _kill_leftovers(sid, marker):
    try:
        os.killpg(sid, signal.SIGKILL)  # the session leader's group
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.time() + 10
    while True:
        pids = _leftovers(sid, marker)
        if not pids:
            return []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.time() > deadline:
            return pids
        time.sleep(0.1)


class Chromium:
    def __init__(self, binary, out_dir, timeout_s, page_host):
        self.binary = binary
        self.out_dir = out_dir
        self.timeout_s = timeout_s
        self.page_host = page_host
        self.runs = 0

    def run(self, label, url, extra_args, stdout_path, net_log_path, budget_ms):
        """Runs chromium once; returns (rc or None on timeout, seconds)."""
        self.runs += 1
        tmp = tempfile.mkdtemp(prefix="baton-chromium-")
        home = os.path.join(tmp, "home")
        os.makedirs(os.path.join(home, ".config"))
        env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=os.path.join(home, ".config"),
                   XDG_CACHE_HOME=os.path.join(home, ".cache"))
        env.pop("DISPLAY", None)
        env.pop("WAYLAND_DISPLAY", None)
        args = [
            self.binary,
            "--headless=new",
            "--no-sandbox",  # runs as root
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--user-data-dir=" + os.path.join(tmp, "profile"),
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-features=NetworkTimeServiceQuerying,MediaRouter,OptimizationHints,Translate",
            # Hermetic: nothing but the page's host resolves. Requests to other
            # hosts are still attempted, and logged, so the net log check sees them.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE " + self.page_host,
            "--hide-scrollbars",
            "--mute-audio",
            "--window-size=1280,1000",
            "--log-net-log=" + net_log_path,
            "--net-log-capture-mode=Default",
            "--virtual-time-budget=%d" % budget_ms,
        ] + extra_args + [url]
        log_path = os.path.join(self.out_dir, "chromium-%d-%s.log" % (self.runs, label))
        t0 = time.time()
        rc = None
        proc = None
        try:
            with open(stdout_path, "wb") as out, open(log_path, "wb") as err:
                proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        env=env, cwd=tmp, start_new_session=True)
                try:
                    rc = proc.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    rc = None
        finally:
            if proc is not None:
                left = _kill_leftovers(proc.pid, tmp)
                if proc.poll() is None:
                    proc.wait(timeout=10)
                if left:
                    print("WARNING: could not kill chromium pids %s" % left, file=sys.stderr)
            shutil.rmtree(tmp, ignore_errors=True)
        return rc, time.time() - t0, log_path


# ---------------------------------------------------------------- DOM parsing

class Node:
    __slots__ = ("tag", "attrs", "children", "parent")

    def __init__(self, tag, attrs, parent):
        self.tag = tag
        self.attrs = dict(attrs)
        self.children = []
        self.parent = parent

    def classes(self):
        return (self.attrs.get("class") or "").split()

    def text(self):
        parts = []

        def walk(n):
            for c in n.children:
                if isinstance(c, str):
                    parts.append(c)
                else:
                    walk(c)
        walk(self)
        return "".join(parts)

    def iter(self):
        for c in self.children:
            if not isinstance(c, str):
                yield c
                yield from c.iter()


class TreeBuilder(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        if tag not in VOID_TAGS:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


class Page:
    def __init__(self, html_text):
        b = TreeBuilder()
        b.feed(html_text)
        b.close()
        self.root = b.root
        self.by_id = {}
        for n in self.root.iter():
            if "id" in n.attrs:
                self.by_id.setdefault(n.attrs["id"], n)

    def text(self, id_):
        n = self.by_id.get(id_)
        return None if n is None else n.text().strip()

    def worker_rows(self):
        table = self.by_id.get("fleet")
        if table is None or table.tag != "table":
            return None
        rows = []
        for tbody in (c for c in table.children if not isinstance(c, str) and c.tag == "tbody"):
            for tr in (c for c in tbody.iter() if c.tag == "tr" and "worker" in c.classes()):
                rows.append([td.text().strip() for td in tr.children
                             if not isinstance(td, str) and td.tag in ("td", "th")])
        return rows


def load_dom(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def parse_int(s):
    return int(s) if s is not None and re.fullmatch(r"-?\d+", s) else None


# ---------------------------------------------------------------- net log

def read_net_log(path):
    """Returns (event type id -> name, events). Tolerates a log cut short."""
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8", "replace")
    try:
        d = json.loads(raw)
        types = {v: k for k, v in d["constants"]["logEventTypes"].items()}
        return types, d.get("events") or []
    except (ValueError, KeyError):
        pass
    # A log whose writer was killed lacks its tail: the constants are the
    # first line, then one event per line ending in a comma.
    lines = raw.splitlines()
    types = {}
    if lines:
        try:
            c = json.loads(lines[0].rstrip(",") + "}")["constants"]
            types = {v: k for k, v in c["logEventTypes"].items()}
        except (ValueError, KeyError):
            pass
    events = []
    for line in lines[1:]:
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
    return types, events


def origin_of(url):
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:
        return url, ""
    scheme = (u.scheme or "").lower()
    if scheme in ("http", "https", "ws", "wss"):
        try:
            port = u.port
        except ValueError:
            port = None
        if port is None:
            port = 443 if scheme in ("https", "wss") else 80
        host = (u.hostname or "").lower()
        if ":" in host:
            host = "[" + host + "]"
        return "%s://%s:%d" % (scheme, host, port), scheme
    return scheme + ":", scheme


class NetCheck:
    """Attributes every request in the net logs to the page or to the browser."""

    def __init__(self, page_url):
        self.page_origin, _ = origin_of(page_url)
        u = urllib.parse.urlsplit(page_url)
        self.page_scheme = u.scheme.lower()
        self.page_host = (u.hostname or "").lower()
        self.origins = {}  # origin -> {"page": n, "browser": n, "unattributed": n, "why": set()}
        self.page_urls = set()

    def _site_is_page(self, key):
        """key: a network isolation/anonymization key; its first word is the top-frame site."""
        if not key:
            return False
        site = key.split()[0].strip("<>")
        if site in ("null", "") or "://" not in site:
            return False
        scheme, host = site.split("://", 1)
        host = host.split("/")[0].lower()
        if host.startswith("["):
            host = host.split("]")[0] + "]"
        else:
            host = host.split(":")[0]
        ph = self.page_host if ":" not in self.page_host else "[" + self.page_host + "]"
        return scheme == self.page_scheme and (ph == host or ph.endswith("." + host))

    def _note(self, origin, who, why):
        o = self.origins.setdefault(origin, {"page": 0, "browser": 0, "unattributed": 0, "why": set()})
        o[who] += 1
        if why:
            o["why"].add(why)

    def add_log(self, path):
        types, events = read_net_log(path)
        for e in events:
            t = types.get(e.get("type"), str(e.get("type")))
            p = e.get("params") or {}
            if not isinstance(p, dict):
                continue
            if t == "URL_REQUEST_START_JOB" and "url" in p:
                origin, _ = origin_of(p["url"])
                init = p.get("initiator")
                nik = p.get("network_isolation_key", "")
                renderer = init not in (None, "", "not an origin")
                if renderer or self._site_is_page(nik):
                    self._note(origin, "page", None)
                    if origin == self.page_origin:
                        self.page_urls.add(p["url"])
                else:
                    self._note(origin, "browser", "initiator=%s nik=%s" % (init, nik or "-"))
            elif t in ("HOST_RESOLVER_MANAGER_REQUEST", "HOST_RESOLVER_MANAGER_JOB") and "host" in p:
                if "~notfound" in p["host"]:
                    continue  # the name our --host-resolver-rules maps every other host to
                host = p["host"] if "://" in p["host"] else "http://" + p["host"]
                origin, _ = origin_of(host)
                nak = p.get("network_anonymization_key", "")
                if self._site_is_page(nak):
                    self._note(origin, "page", None)
                else:
                    self._note(origin, "browser", "dns nak=%s" % (nak or "-"))
            elif "group_id" in p and isinstance(p["group_id"], str):
                # Socket pool groups, e.g. "pm/https://host:443 <https://site same_site>":
                # also what a <link rel=preconnect> leaves behind.
                m = re.match(r"^(?:[a-z]+/)*([a-z][a-z0-9+.-]*://\S+)\s*(?:<(.*)>)?", p["group_id"])
                if m:
                    origin, _ = origin_of(m.group(1))
                    if self._site_is_page(m.group(2) or ""):
                        self._note(origin, "page", None)
                    else:
                        self._note(origin, "browser", "socket nak=%s" % (m.group(2) or "-"))
            else:
                # Any other URL in the log must belong to an origin accounted for above.
                for k in ("url", "original_url", "location", "new_url"):
                    v = p.get(k)
                    if isinstance(v, str) and re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", v):
                        origin, _ = origin_of(v)
                        self.origins.setdefault(origin, {"page": 0, "browser": 0,
                                                         "unattributed": 0, "why": set()})
        for o in self.origins.values():
            if o["page"] == 0 and o["browser"] == 0:
                o["unattributed"] += 1

    def verdicts(self):
        out = []
        for origin in sorted(self.origins):
            o = self.origins[origin]
            scheme = origin.split(":", 1)[0]
            if origin == self.page_origin:
                out.append((origin, True, "the page's origin (%d net log records)" % o["page"]))
            elif scheme in IGNORED_SCHEMES:
                out.append((origin, True, "ignored scheme"))
            elif o["page"]:
                out.append((origin, False, "requested by the page (%d net log records)" % o["page"]))
            elif o["browser"] and not o["unattributed"]:
                out.append((origin, True, "browser-internal, ignored (%d net log records; %s)"
                            % (o["browser"], "; ".join(sorted(o["why"]))[:160])))
            else:
                out.append((origin, False, "seen in the net log but not attributable"))
        return out


# ---------------------------------------------------------------- main

def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def focus_job(status):
    """The job the page's panels show (status_page.js focusJob): the newest not ended, else the newest."""
    jobs = status.get("jobs") or []
    ended = ("JOB_FINISHED", "JOB_STOPPED", "JOB_FAILED", "JOB_UNREADABLE")
    for j in reversed(jobs):
        if j.get("state") not in ended:
            return j
    return jobs[-1] if jobs else {}


def check_rank_chart(f, page, url, ranks):
    """The per-rank chart's bars against /api/status's rank_times, figure by figure."""
    with urllib.request.urlopen(urllib.parse.urljoin(url, "api/status"), timeout=10) as r:
        status = json.loads(r.read().decode())
    times = focus_job(status).get("rank_times") or []
    chart = page.by_id.get("rank-chart")
    bars = [n for n in chart.iter() if n.tag == "g" and "rank-bar" in n.classes()] if chart is not None else []
    f.check(len(bars) == ranks == len(times), "rank chart: %d bars, /api/status has %d ranks (want %d)"
            % (len(bars), len(times), ranks))
    keys = (("data-compute-ms", "compute_ms"), ("data-exposed-comm-ms", "exposed_comm_ms"), ("data-idle-ms", "idle_ms"))
    for bar, t in zip(bars, times):
        drawn = [float(bar.attrs.get(a, "nan")) for a, _ in keys]
        api = [float(t.get(k, 0)) for _, k in keys]
        same = all(abs(d - a) <= 1e-9 * max(1.0, abs(a)) for d, a in zip(drawn, api)) and \
            int(bar.attrs.get("data-rank", -1)) == int(t.get("rank", 0)) and bar.attrs.get("data-worker") == t.get("worker")
        label = next((n.text().strip() for n in bar.iter() if n.tag == "text" and "figure" in n.classes()), "")
        f.check(same, "rank chart: rank %s on %s drawn compute/exposed comm/idle %s ms = /api/status %s ms (label %r)"
                % (bar.attrs.get("data-rank"), bar.attrs.get("data-worker"), "/".join("%.3f" % d for d in drawn),
                   "/".join("%.3f" % a for a in api), label))
    named = focus_job(status).get("stragglers") or []
    shown = page.text("job-stragglers")
    f.check(shown is not None and (shown == "none") == (not named) and
            all(x.get("worker", "") in shown for x in named),
            "slow ranks %r for /api/status's %d named" % (shown, len(named)))
    link = page.by_id.get("trace-link")
    want = status.get("newest_trace_job", "")
    f.check(link is not None and link.attrs.get("href") == "/api/trace/newest" and want and want in link.text(),
            "newest trace link %r -> %s names job %r" % (link.text().strip() if link else None,
                                                       link.attrs.get("href") if link else None, want))


def main():
    ap = argparse.ArgumentParser(description="Headless-Chromium check of the Baton status page.")
    ap.add_argument("--url", required=True, help="the page, e.g. http://127.0.0.1:8080/")
    ap.add_argument("--out", required=True, help="directory for the DOM dumps, net logs and screenshot")
    ap.add_argument("--workers", type=int, default=4, help="expected tr.worker rows")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--wait", type=float, default=2.0, help="seconds between the two loads")
    ap.add_argument("--budget-ms", type=int, default=3000,
                    help="--virtual-time-budget: page time for fetching and rendering")
    ap.add_argument("--timeout", type=float, default=60.0, help="hard limit per chromium run (s)")
    ap.add_argument("--rank-chart", type=int, default=0,
                    help="expected bars in the per-rank chart, checked against /api/status (a job at rest)")
    args = ap.parse_args()

    u = urllib.parse.urlsplit(args.url)
    if u.scheme not in ("http", "https") or not u.hostname:
        print("error: --url must be http(s)://HOST:PORT/", file=sys.stderr)
        return 2
    if not (os.path.isfile(args.chromium) and os.access(args.chromium, os.X_OK)):
        print("error: no chromium at %s" % args.chromium, file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)
    f = Failures()
    chrome = Chromium(args.chromium, out, args.timeout, u.hostname)
    net = NetCheck(args.url)
    print("page %s (origin %s), chromium %s, output in %s"
          % (args.url, net.page_origin, args.chromium, out), flush=True)

    def dump(n):
        dom_path = os.path.join(out, "dom-%d.html" % n)
        log_path = os.path.join(out, "netlog-%d.json" % n)
        rc, secs, err_path = chrome.run("dump%d" % n, args.url, ["--dump-dom"], dom_path, log_path,
                                        args.budget_ms)
        f.check(rc == 0, "load %d: chromium --dump-dom exited %s in %.1f s (log %s)"
                % (n, "TIMEOUT after %.0f s" % args.timeout if rc is None else rc, secs, err_path))
        if os.path.exists(log_path):
            net.add_log(log_path)
        else:
            f.check(False, "load %d: no net log written at %s" % (n, log_path))
        html_text = load_dom(dom_path) if os.path.exists(dom_path) else ""
        f.check(len(html_text) > 0, "load %d: DOM dump %s (%d bytes)" % (n, dom_path, len(html_text)))
        return Page(html_text)

    # Load 1: structure and figures.
    p1 = dump(1)
    title = (next((n.text() for n in p1.root.iter() if n.tag == "title"), "") or "").strip()
    f.check("Baton" in title and p1.text("title") == "Baton",
            "load 1: page title %r, header %r" % (title, p1.text("title")))
    conn = p1.text("conn")
    f.check(conn == "live", "load 1: connection indicator %r (want 'live'; "
            "'controller unreachable' means api/status failed)" % conn)
    f.info("load 1: last update %s, heartbeat timeout %s" % (p1.text("updated"), p1.text("hb-timeout")))
    rows = p1.worker_rows()
    f.check(rows is not None, "load 1: <table id=\"fleet\"> present")
    rows = rows or []
    f.check(len(rows) == args.workers, "load 1: fleet tr.worker rows: %d (want --workers %d)"
            % (len(rows), args.workers))
    for r in rows:
        cells = r + [""] * 7
        f.info("  worker %-14s rank %-3s state %-11s hb age %-6s addr %-22s cores %-4s mem %s"
               % tuple(cells[:7]))
    f.info("load 1: mesh %s epoch %s axes %s" % (p1.text("mesh-id"), p1.text("mesh-epoch"),
                                                  p1.text("mesh-axes")))
    state1 = p1.text("job-state")
    step1 = parse_int(p1.text("job-step"))
    steps1 = parse_int(p1.text("job-steps"))
    f.check(step1 is not None, "load 1: #job-step %r is a bare integer" % p1.text("job-step"))
    f.check(steps1 is not None, "load 1: #job-steps %r is a bare integer" % p1.text("job-steps"))
    prog = p1.by_id.get("job-progress")
    f.check(prog is not None, "load 1: #job-progress present (value %s of max %s)"
            % (prog.attrs.get("value") if prog else None, prog.attrs.get("max") if prog else None))
    f.info("load 1: job %s %r state %s step %s/%s loss %s tokens/s %s step %s error %s"
           % (p1.text("job-id"), p1.text("job-name"), state1, step1, steps1, p1.text("job-loss"),
              p1.text("job-tps"), p1.text("job-ms"), p1.text("job-error")))
    svg = p1.by_id.get("loss-curve")
    f.check(svg is not None and svg.tag == "svg", "load 1: <svg id=\"loss-curve\"> present")
    if svg is not None:
        poly = next((n for n in svg.iter() if n.tag == "polyline"), None)
        npts = len((poly.attrs.get("points") or "").split()) if poly is not None else 0
        labels = [n.text().strip() for n in svg.iter() if n.tag == "text"]
        f.info("load 1: loss curve: %d polyline points, labels %s" % (npts, labels))
    ev = p1.by_id.get("events")
    f.check(ev is not None and ev.tag == "ul", "load 1: <ul id=\"events\"> present")
    if ev is not None:
        items = [n for n in ev.children if not isinstance(n, str) and n.tag == "li"]
        newest = None
        if items:
            parts = [c.text().strip() for c in items[0].children if not isinstance(c, str)]
            newest = " | ".join(parts) if parts else items[0].text().strip()
        f.info("load 1: %d event(s); newest: %r" % (len(items), newest))

    if args.rank_chart:
        check_rank_chart(f, p1, args.url, args.rank_chart)
    else:
        # Load 2: the step moves.
        time.sleep(args.wait)
        p2 = dump(2)
        step2 = parse_int(p2.text("job-step"))
        f.check(step1 is not None and step2 is not None and step2 > step1,
                "job step advanced: %s -> %s over %.1f s (job state %s -> %s)"
                % (step1, step2, args.wait, state1, p2.text("job-state")))

    # Load 3: screenshot.
    shot = os.path.join(out, "status_page.png")
    if os.path.exists(shot):
        os.remove(shot)
    rc, secs, err_path = chrome.run("screenshot", args.url, ["--screenshot=" + shot], os.devnull,
                                    os.path.join(out, "netlog-3.json"), args.budget_ms)
    f.check(rc == 0, "screenshot: chromium exited %s in %.1f s (log %s)"
            % ("TIMEOUT after %.0f s" % args.timeout if rc is None else rc, secs, err_path))
    if os.path.exists(os.path.join(out, "netlog-3.json")):
        net.add_log(os.path.join(out, "netlog-3.json"))
    size = png_size(shot) if os.path.exists(shot) else None
    f.check(size is not None, "screenshot: %s is a PNG %s (%d bytes)"
            % (shot, "%dx%d" % size if size else "?", os.path.getsize(shot) if os.path.exists(shot) else 0))

    # The network: only the page's own origin.
    verdicts = net.verdicts()
    print("      distinct origins in the net logs: %s" % ", ".join(o for o, _, _ in verdicts), flush=True)
    api = [x for x in net.page_urls if urllib.parse.urlsplit(x).path.endswith("/api/status")]
    f.check(bool(api), "net log recorded the page's own api/status requests (%s)" % ", ".join(sorted(api)))
    for origin, ok, why in verdicts:
        f.check(ok, "request origin %s: %s" % (origin, why))

    if f.failed:
        print("\nstatus_page_check: %d check(s) FAILED:" % len(f.failed))
        for w in f.failed:
            print("  - " + w)
        return 1
    print("\nstatus_page_check: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
