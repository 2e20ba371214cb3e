"""The Kubernetes deployment on five "hosts": network namespaces on a bridge.

What the cluster would run comes from deploy/k8s itself: the cpu overlay is
rendered with kubectl kustomize and every pod (the controller Deployment's,
and one per StatefulSet replica) is emulated as the kubelet would run it:

  - a network namespace per pod with its own address on a private /24
    behind a bridge in the root namespace, an eth0 and a lo;
  - /etc/netns/<ns>/hosts standing in for cluster DNS (the controller
    Service's name and the workers' names); `ip netns exec` bind-mounts it
    over /etc/hosts;
  - the pod's volumes as directories: the Secret baton-tokens written as the
    kubelet writes it, emptyDirs empty; mount paths in the containers'
    command lines rewritten to those directories;
  - a /dev/shm of its own (a 64 MiB tmpfs, as the kubelet mounts), so its
    collectives with other pods go over the network;
  - init containers run to completion first (they copy the tokens);
  - each daemon started with exactly the container's command and args, the
    /usr/local/bin binary replaced by the Bazel-built one, its env built as
    the kubelet builds it (fieldRef POD_NAME / POD_IP, $(VAR) expansion).

Then, from the controller's namespace as `kubectl exec` into the controller
pod would (the client token from the controller pod's token volume): the fleet
registers under the StatefulSet names with ranks = ordinals and pod IPs;
every gRPC probe of the manifests passes as the kubelet would make it; the
daemons' HTTP ports serve /metrics; `baton check --mesh dp=2,tp=2` passes; a
20-step FSDP job trains with losses equal to the same job's on a loopback
fleet (`baton up`); a worker whose link is cut is reported DEAD by name
within 5 s; with the link back it rejoins and `baton check` passes again; a
worker's container killed is restarted in its pod's namespace (restartPolicy
Always) and a detached HSDP job recovers from its live replicas (no disk:
the pods share none) and finishes.
Finally the pods are deleted as the kubelet deletes them: SIGTERM, readiness
NOT_SERVING while draining, exit within terminationGracePeriodSeconds.

Needs root and `ip netns` (skips, saying why, without them) and a kubectl.
Every step has a deadline and the whole test a hard limit; whatever happens,
the daemons are killed by pid (and die with this process even if it is
SIGKILLed) and the namespaces, links, bridge and hosts files are removed.

  multihost_test.py --baton B --controller_bin C --worker_bin W --k8s FILE... --examples FILE...
"""

import ctypes
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

# kube.py sits beside this script; no bytecode written into the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kube  # noqa: E402
from kube import CheckFailed, check, log  # noqa: E402

TEST = "multihost_test"
HARD_LIMIT_S = 270          # the whole test (Bazel's "moderate" timeout is 300 s)
DEAD_WITHIN_S = 5.0         # a cut worker must be DEAD this soon
NAMESPACE = "baton"         # the overlay's namespace (for the DNS names)
CONTROLLER, WORKER = "baton-controller", "baton-worker"
JOB_STEPS = 20
JOB_EXAMPLE = "decoder_fsdp4.textproto"
RESTART_EXAMPLE = "decoder_hsdp.textproto"  # replicas: its restore needs no disk
RESTART_JOB_STEPS = 60
MESH = "dp=2,tp=2"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where the image has its binaries; the test runs the Bazel-built ones instead.
IMAGE_BIN = "/usr/local/bin/"

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


# A pod's own /dev/shm, as the kubelet mounts one (a 64 MiB tmpfs): pods on
# one machine share no shared memory, so the gloo groups between them move
# bytes over the network, not through /dev/shm. A mount namespace of the
# daemon's own (unshare and sh exec in place: the pid is the daemon's).
POD_SHM = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
           'mount -t tmpfs -o size=64m,mode=1777 pod-shm /dev/shm && exec "$@"', "pod-shm"]


def die_with_parent():
    """In a child before exec: SIGKILL it when this test process dies, however
    it dies. `ip netns exec` execs the daemon in place, so this holds for the
    daemon itself."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Interrupted(Exception):
    pass


def _interrupt(signum, _frame):
    if signum == signal.SIGALRM:
        raise Interrupted("the test ran past its hard limit of %d s" % HARD_LIMIT_S)
    raise Interrupted("stopped by signal %d" % signum)


def run(argv, timeout, env=None, check_exit=True, what=None):
    """Runs a command to completion with a deadline; its output as text."""
    what = what or " ".join(argv[:6])
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                           preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired:
        raise CheckFailed("%s: no result within %s s" % (what, timeout))
    if check_exit and r.returncode != 0:
        raise CheckFailed("%s: exit %d\n%s%s" % (what, r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
    return r


def ip_tool():
    path = shutil.which("ip", path=os.environ.get("PATH", "") + ":" + SYSTEM_PATH)
    return path


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------ network

class Network:
    """A bridge in the root namespace and one namespace per pod, each with a
    veth whose namespace end is its eth0. All names carry this process's id
    (bt<pid>...), so concurrent runs do not collide and leftovers of a run
    that was SIGKILLed can be recognised and swept."""

    def __init__(self, ip):
        self.ip = ip
        self.tag = "bt%d" % os.getpid()
        self.bridge = self.tag + "br"
        self.prefix = None        # "10.213.X."
        self.namespaces = []      # created, in order
        self.host_links = {}      # namespace -> root-side veth
        self.etc_dirs = []
        self.bridge_made = False
        self.made_etc_netns = False

    def cmd(self, *args, timeout=10):
        return run([self.ip] + list(args), timeout=timeout, what="ip " + " ".join(args))

    @staticmethod
    def sweep_stale(ip):
        """Removes namespaces, links and /etc/netns dirs of earlier runs whose
        process is gone (a run killed before its cleanup)."""
        pattern = re.compile(r"^bt(\d+)(br|c|w\d+|probe)$")
        removed = []
        names = run([ip, "netns", "list"], timeout=10).stdout.split()
        for ns in names:
            m = pattern.match(ns)
            if m and not pid_alive(int(m.group(1))):
                run([ip, "netns", "delete", ns], timeout=10, check_exit=False)
                removed.append("netns " + ns)
        for line in run([ip, "-o", "link", "show"], timeout=10).stdout.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                name = parts[1].strip().split("@")[0]
                m = pattern.match(name)
                if m and not pid_alive(int(m.group(1))):
                    run([ip, "link", "delete", name], timeout=10, check_exit=False)
                    removed.append("link " + name)
        # Work directories (outside Bazel, which cleans its own).
        parent = os.environ.get("TEST_TMPDIR") or tempfile.gettempdir()
        for d in os.listdir(parent):
            m = re.match(r"^multihost\.(\d+)\.", d)
            if m and not pid_alive(int(m.group(1))):
                shutil.rmtree(os.path.join(parent, d), ignore_errors=True)
                removed.append(os.path.join(parent, d))
        if os.path.isdir("/etc/netns"):
            swept_etc = False
            for d in os.listdir("/etc/netns"):
                m = pattern.match(d)
                if m and not pid_alive(int(m.group(1))):
                    shutil.rmtree(os.path.join("/etc/netns", d), ignore_errors=True)
                    removed.append("/etc/netns/" + d)
                    swept_etc = True
            if swept_etc:
                try:
                    os.rmdir("/etc/netns")  # the dead run made it, unless something else is in it
                except OSError:
                    pass
        if removed:
            log("swept leftovers of earlier runs: %s" % ", ".join(removed))

    def pick_subnet(self):
        """A random 10.213.X.0/24 that no address or route here uses."""
        used = self.cmd("-4", "-o", "addr", "show").stdout + self.cmd("-4", "route", "show", "table", "all").stdout
        candidates = list(range(256))
        random.shuffle(candidates)
        for x in candidates:
            prefix = "10.213.%d." % x
            if prefix not in used:
                self.prefix = prefix
                return prefix
        raise CheckFailed("every 10.213.X.0/24 is in use here")

    def create_bridge(self):
        try:
            # Frames between our veths must not meet the host's iptables
            # FORWARD policy (br_netfilter): this bridge only.
            self.cmd("link", "add", self.bridge, "type", "bridge", "nf_call_iptables", "0",
                     "nf_call_ip6tables", "0", "nf_call_arptables", "0")
        except CheckFailed:
            self.cmd("link", "add", self.bridge, "type", "bridge")
        self.bridge_made = True
        self.cmd("addr", "add", self.prefix + "1/24", "dev", self.bridge)
        self.cmd("link", "set", self.bridge, "up")

    def add_namespace(self, suffix, address, hosts, resolv):
        ns = self.tag + suffix
        host_link, temp_peer = ns, ns + "p"
        etc = os.path.join("/etc/netns", ns)
        if not os.path.isdir("/etc/netns"):
            self.made_etc_netns = True
        # The files first: `ip netns exec` bind-mounts /etc/netns/<ns>/* over
        # /etc/* (hosts stands in for the cluster DNS).
        os.makedirs(etc, exist_ok=True)
        self.etc_dirs.append(etc)
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write(hosts)
        with open(os.path.join(etc, "resolv.conf"), "w") as f:
            f.write(resolv)
        self.cmd("netns", "add", ns)
        self.namespaces.append(ns)
        self.cmd("link", "add", host_link, "type", "veth", "peer", "name", temp_peer)
        self.host_links[ns] = host_link
        self.cmd("link", "set", temp_peer, "netns", ns)
        self.cmd("-n", ns, "link", "set", temp_peer, "name", "eth0")
        self.cmd("-n", ns, "addr", "add", address + "/24", "dev", "eth0")
        self.cmd("-n", ns, "link", "set", "eth0", "up")
        self.cmd("-n", ns, "link", "set", "lo", "up")
        self.cmd("link", "set", host_link, "master", self.bridge)
        self.cmd("link", "set", host_link, "up")
        return ns

    def set_link(self, ns, up):
        """The root-side end of a namespace's veth: down is a pulled cable."""
        self.cmd("link", "set", self.host_links[ns], "up" if up else "down")

    def destroy(self):
        """Everything this run created; returns what could not be removed."""
        problems = []
        for ns in reversed(self.namespaces):
            # Deleting the namespace deletes its eth0 and with it the
            # root-side veth.
            r = run([self.ip, "netns", "delete", ns], timeout=10, check_exit=False)
            if r.returncode != 0:
                problems.append("netns %s: %s" % (ns, r.stderr.strip()))
        # The kernel removes a deleted namespace's veths asynchronously: a
        # link may vanish between looking and deleting; only one that is
        # still there afterwards is a problem.
        exists = lambda link: run([self.ip, "link", "show", link], timeout=10, check_exit=False).returncode == 0
        for link in list(self.host_links.values()) + ([self.bridge] if self.bridge_made else []):
            if exists(link):
                r = run([self.ip, "link", "delete", link], timeout=10, check_exit=False)
                if r.returncode != 0 and exists(link):
                    problems.append("link %s: %s" % (link, r.stderr.strip()))
        for d in self.etc_dirs:
            shutil.rmtree(d, ignore_errors=True)
            if os.path.exists(d):
                problems.append("cannot remove " + d)
        if self.made_etc_netns:
            try:
                os.rmdir("/etc/netns")  # only if empty: another run may use it
            except OSError:
                pass
        # Verify, not just trust.
        left = set(run([self.ip, "netns", "list"], timeout=10).stdout.split())
        problems += ["netns %s still exists" % ns for ns in self.namespaces if ns in left]
        return problems


# ---------------------------------------------------------------------- pods

class Pod:
    """One pod of the rendered manifests, emulated on this machine."""

    def __init__(self, name, workload, root, address, ns, secrets):
        self.name = name
        self.workload = workload
        self.spec = kube.pod_spec(workload)
        self.dir = os.path.join(root, name)
        self.address = address
        self.ns = ns
        self.secrets = secrets
        self.fields = {"metadata.name": name, "metadata.namespace": NAMESPACE, "status.podIP": address,
                       "spec.nodeName": "node-" + name, "status.hostIP": address}
        self.volumes = {}
        self.process = None
        self.log_path = os.path.join(self.dir, "daemon.log")
        os.makedirs(self.dir)
        # Log lines name the pod's directory $POD, not its long path.
        self.short = lambda text: text.replace(self.dir, "$POD")

    def make_volumes(self):
        """Directories for the pod's volumes, filled as the kubelet fills
        them. A Secret's files get defaultMode; with an fsGroup the kubelet
        adds group read (0440) and they belong to root: hence the init
        container that copies them."""
        fs_group = self.spec.get("securityContext", {}).get("fsGroup")
        for v in self.spec.get("volumes", []):
            path = os.path.join(self.dir, "volumes", v["name"])
            os.makedirs(path)
            if "secret" in v:
                src = v["secret"]
                data = self.secrets[src["secretName"]]
                items = src.get("items") or [{"key": k, "path": k} for k in sorted(data)]
                mode = src.get("defaultMode", 0o644) | (0o440 if fs_group is not None else 0)
                for item in items:
                    target = os.path.join(path, item["path"])
                    with open(target, "w") as f:
                        f.write(data[item["key"]])
                    os.chmod(target, item.get("mode", mode))
                log("  %s: Secret %s -> %s (mode %04o)" % (self.name, src["secretName"],
                                                           ", ".join(i["path"] for i in items), mode))
            elif "emptyDir" not in v:
                raise CheckFailed("%s: volume %s of kind %s is not emulated" % (self.name, v["name"], sorted(v)))
            self.volumes[v["name"]] = path

    def mounts(self, c):
        out = {}
        for m in c.get("volumeMounts", []):
            host = self.volumes[m["name"]]
            if m.get("subPath"):
                host = os.path.join(host, m["subPath"])
            out[m["mountPath"]] = host
        return out

    def argv(self, c, binaries):
        """The container's command line and environment on this machine."""
        env = kube.container_env(c, self.fields, self.secrets)
        argv = kube.command_line(c, env)
        mounts = self.mounts(c)
        argv = [kube.replace_mount_paths(a, mounts) for a in argv]
        check(argv, "%s/%s has no command (the image has no ENTRYPOINT)" % (self.name, c["name"]))
        if argv[0].startswith(IMAGE_BIN):
            binary = argv[0][len(IMAGE_BIN):]
            check(binary in binaries, "%s runs %s, which the image does not have" % (c["name"], argv[0]))
            argv[0] = binaries[binary]
        # What a container gets besides its spec's env: the image's PATH,
        # HOSTNAME, HOME (the user has none). Sanitizer settings pass
        # through so that --config=asan runs keep working.
        full_env = {"PATH": SYSTEM_PATH, "HOSTNAME": self.name, "HOME": "/"}
        for key in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"):
            if key in os.environ:
                full_env[key] = os.environ[key]
        full_env.update(env)
        return argv, full_env

    def run_init_containers(self, binaries):
        for c in self.spec.get("initContainers", []):
            argv, env = self.argv(c, binaries)
            r = run(argv, timeout=20, env=env, check_exit=False, what="%s init container %s" % (self.name, c["name"]))
            check(r.returncode == 0, "%s init container %s failed (exit %d): %s %s"
                  % (self.name, c["name"], r.returncode, r.stdout, r.stderr))
            shown = argv[2:] if argv[:2] == ["/bin/sh", "-c"] else argv
            log("  %s: init container %s done: %s" % (self.name, c["name"], self.short(" ".join(shown))))

    def start(self, ip, binaries, restart=False):
        """Starts the container's daemon; `restart`: again, as the kubelet
        restarts a container that died (its log appended to)."""
        c = kube.container(self.workload)
        argv, env = self.argv(c, binaries)
        cwd = os.path.join(self.dir, "workdir")
        os.makedirs(cwd, exist_ok=restart)
        if not restart:
            log("  %s (netns %s, %s): %s" % (self.name, self.ns, self.address, self.short(" ".join(argv))))
        with open(self.log_path, "a" if restart else "w") as out:
            self.process = subprocess.Popen(POD_SHM + [ip, "netns", "exec", self.ns] + argv, env=env, cwd=cwd,
                                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=die_with_parent)

    def check_running(self):
        if self.process is not None and self.process.poll() is not None:
            raise CheckFailed("%s exited (%s):\n%s" % (self.name, self.process.returncode, self.log_tail()))

    def log_tail(self, lines=25):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def token_file(self, key):
        """Where the init container put a token: the file of that name on
        the daemon's volumes (what `kubectl exec` would find)."""
        c = kube.container(self.workload)
        for host_dir in self.mounts(c).values():
            candidate = os.path.join(host_dir, key)
            if os.path.isfile(candidate):
                return candidate
        raise CheckFailed("%s has no %s on its volumes" % (self.name, key))


def stop_processes(processes, grace_s):
    """SIGTERM, then SIGKILL whatever is left after grace_s; reaps all.
    Returns how many needed SIGKILL."""
    live = [p for p in processes if p is not None and p.poll() is None]
    for p in live:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in live):
        time.sleep(0.05)
    killed = 0
    for p in live:
        if p.poll() is None:
            p.kill()
            killed += 1
        p.wait()
    return killed


# ------------------------------------------------------------------ clients

class Baton:
    """The baton CLI, run in the controller pod's namespace (as `kubectl exec
    deploy/baton-controller -- baton ...` would) or on the root namespace."""

    def __init__(self, binary, ip, ns, token_file, address):
        self.binary, self.ip, self.ns, self.address = binary, ip, ns, address
        self.env = {"PATH": SYSTEM_PATH, "HOME": "/", "BATON_TOKEN_FILE": token_file}

    def __call__(self, *args, timeout=60, check_exit=True):
        argv = [self.ip, "netns", "exec", self.ns, self.binary] + list(args)
        return run(argv, timeout=timeout, env=self.env, check_exit=check_exit, what="baton " + " ".join(args))

    def workers(self):
        """{name: worker} from baton status --output json."""
        r = self("status", "--controller", self.address, "--output", "json", timeout=10)
        return {w["name"]: w for w in json.loads(r.stdout).get("workers", [])}


def losses(stdout):
    """The per-step losses of `baton run --output json`."""
    steps = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"step"')]
    check([s["step"] for s in steps] == list(range(1, JOB_STEPS + 1)),
          "expected steps 1..%d, got %s" % (JOB_STEPS, [s["step"] for s in steps]))
    return [s["loss"] for s in steps]


def fetch(url):
    """GET through no proxy; (status, body)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as r:
        return r.status, r.read().decode("utf-8", "replace")


_HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def grpc_health(address, service="", timeout_s=2.0):
    """grpc.health.v1.Health/Check as the kubelet's gRPC probe makes it;
    the status name, or the error. The two messages are one optional field
    each, so they are encoded by hand (python3-grpcio has no health stubs)."""
    import grpc
    request = b""
    if service:
        encoded = service.encode()
        check(len(encoded) < 128, "service name too long for this encoder")
        request = b"\x0a" + bytes([len(encoded)]) + encoded
    # The kubelet talks to the pod directly: no proxy.
    with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            response = channel.unary_unary("/grpc.health.v1.Health/Check")(request, timeout=timeout_s)
        except grpc.RpcError as e:
            return "error %s" % e.code().name
    status = response[1] if len(response) >= 2 and response[0] == 0x08 else 0
    return _HEALTH_STATUS.get(status, str(status))


def probes(pod):
    """{kind: (address, service)} of the pod's container's gRPC probes."""
    c = kube.container(pod.workload)
    out = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if c.get(kind) and "grpc" in c[kind]:
            out[kind] = ("%s:%d" % (pod.address, c[kind]["grpc"]["port"]), c[kind]["grpc"].get("service", ""))
    return out


def wait_until(what, timeout_s, probe, interval_s=0.1, on_poll=None):
    """Polls probe() until it returns a true value; that value."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        if on_poll:
            on_poll()
        try:
            value = probe()
            if value:
                return value
        except CheckFailed as e:
            last_error = e
        time.sleep(interval_s)
    raise CheckFailed("%s: not within %s s%s" % (what, timeout_s, " (last error: %s)" % last_error
                                                 if last_error else ""))


def json_lines(path):
    total = parsed = 0
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            total += 1
            try:
                if isinstance(json.loads(line), dict):
                    parsed += 1
            except ValueError:
                pass
    return parsed, total


# --------------------------------------------------------------------- test

def scenario(a, ip, net, pods, state, work):
    binaries = {"baton": a.baton, "baton-controller": a.controller_bin, "baton-worker": a.worker_bin}

    # What the cluster would run: the cpu overlay.
    kubectl = kube.kubectls()[0]
    k8s_dir = kube.staged_k8s_tree(a.k8s, os.path.join(work, "deploy"))
    objects = kube.render(kubectl, os.path.join(k8s_dir, "overlays", "cpu"))
    dep = kube.one(objects, "Deployment", CONTROLLER)
    sts = kube.one(objects, "StatefulSet", WORKER)
    replicas = sts["spec"]["replicas"]
    log("rendered overlays/cpu with %s: Deployment %s, StatefulSet %s x%d"
        % (kubectl, CONTROLLER, WORKER, replicas))
    check(replicas == 4, "the mesh %s needs 4 workers; the StatefulSet has %d" % (MESH, replicas))
    ports = lambda workload: {p["name"]: p["containerPort"] for p in kube.container(workload)["ports"]}
    grpc_port, http_port = ports(dep)["grpc"], ports(dep)["http"]
    worker_grpc, worker_http = ports(sts)["grpc"], ports(sts)["http"]

    # The network: a bridge and a namespace per pod, hosts files as DNS.
    prefix = net.pick_subnet()
    net.create_bridge()
    controller_ip = prefix + "10"
    worker_names = ["%s-%d" % (WORKER, i) for i in range(replicas)]
    worker_ips = [prefix + str(20 + i) for i in range(replicas)]
    hosts = ["# tests/deploy/multihost_test.py: stand-in for the cluster DNS",
             "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             "%s\t%s %s.%s %s.%s.svc %s.%s.svc.cluster.local" % (controller_ip, CONTROLLER, CONTROLLER, NAMESPACE,
                                                               CONTROLLER, NAMESPACE, CONTROLLER, NAMESPACE)]
    for name, addr in zip(worker_names, worker_ips):
        hosts.append("%s\t%s %s.%s %s.%s.%s.svc.cluster.local" % (addr, name, name, WORKER, name, WORKER, NAMESPACE))
    hosts_text = "\n".join(hosts) + "\n"
    # Every name the test uses is in hosts. gRPC's c-ares resolver still
    # asks a DNS server (for AAAA records): one it cannot route to fails at
    # once, where a silent one (say 127.0.0.1 in the namespace) costs its
    # full timeout, 3 s per lookup.
    resolv = "# no DNS here: names are in /etc/hosts (TEST-NET-1, unroutable)\nnameserver 192.0.2.1\n"
    controller_ns = net.add_namespace("c", controller_ip, hosts_text, resolv)
    worker_ns = [net.add_namespace("w%d" % i, addr, hosts_text, resolv) for i, addr in enumerate(worker_ips)]
    log("network: bridge %s %s1/24; %s %s in %s; %s" % (
        net.bridge, prefix, CONTROLLER, controller_ip, controller_ns,
        ", ".join("%s %s in %s" % t for t in zip(worker_names, worker_ips, worker_ns))))

    # The Secret the operator would create (deploy/README.md).
    secrets = {"baton-tokens": {"client.token": os.urandom(24).hex() + "\n",
                                "worker.token": os.urandom(24).hex() + "\n"}}

    # The pods: volumes, init containers, then the daemons.
    pods_root = os.path.join(work, "pods")
    controller = Pod("%s-5d8c7b9f4-x7k2p" % CONTROLLER, dep, pods_root, controller_ip, controller_ns, secrets)
    workers = [Pod(n, sts, pods_root, addr, ns, secrets) for n, addr, ns in zip(worker_names, worker_ips, worker_ns)]
    pods.extend([controller] + workers)
    log("pods ($POD below: %s/<pod>, its volumes in $POD/volumes/<volume>):" % pods_root)
    for pod in pods:
        pod.make_volumes()
        pod.run_init_containers(binaries)
    for pod in pods:
        argv, _ = pod.argv(kube.container(pod.workload), binaries)
        for arg in argv:
            if kube.flag_name(arg) and kube.flag_name(arg).endswith("token_file"):
                path = arg.split("=", 1)[1]
                check(os.path.isfile(path), "%s: %s names %s, which no init container wrote" % (pod.name, arg, path))
                mode = os.stat(path).st_mode & 0o777
                check(mode & 0o077 == 0, "%s: %s has mode %04o; the daemon wants 0600 or stricter"
                      % (pod.name, path, mode))
    log("  token files after the init containers: mode 0400 or stricter (the daemons need 0600 or stricter)")
    log("starting the daemons:")
    controller.start(ip, binaries)
    for w in workers:
        w.start(ip, binaries)

    address = "%s:%d" % (CONTROLLER, grpc_port)
    baton = Baton(a.baton, ip, controller_ns, controller.token_file("client.token"), address)

    def all_running():
        for pod in pods:
            pod.check_running()

    # Registration: the StatefulSet names, rank = ordinal, the pod IPs.
    t0 = time.monotonic()

    def fleet_ready():
        ws = baton.workers()
        alive = [n for n in worker_names if n in ws and ws[n]["state"] != "DEAD"]
        return ws if len(alive) == len(worker_names) else None
    ws = wait_until("4 workers registered", 60, fleet_ready, interval_s=0.2, on_poll=all_running)
    log("fleet up in %.1f s (baton status --controller %s from %s):" % (time.monotonic() - t0, address, controller_ns))
    for i, n in enumerate(worker_names):
        w = ws[n]
        log("  %-16s rank %d  %-20s %s" % (n, w["rank"], w["address"], w["state"]))
        check(w["rank"] == i, "%s has rank %d, expected its ordinal %d" % (n, w["rank"], i))
        check(w["address"] == "%s:%d" % (worker_ips[i], worker_grpc),
              "%s advertises %s, expected its pod IP %s:%d" % (n, w["address"], worker_ips[i], worker_grpc))

    # The kubelet's view: every gRPC probe of every pod passes.
    for pod in pods:
        results = {kind: grpc_health(addr, service) for kind, (addr, service) in sorted(probes(pod).items())}
        log("  probes of %s: %s" % (pod.name, ", ".join("%s grpc %s %s" % (k[:-5], probes(pod)[k][0], v)
                                                         for k, v in sorted(results.items()))))
        check(results and all(v == "SERVING" for v in results.values()),
              "%s: probes would fail: %s" % (pod.name, results))

    # The HTTP ports the Prometheus annotations point at.
    for url, what in (("http://%s:%d/metrics" % (controller_ip, http_port), "controller /metrics"),
                      ("http://%s:%d/api/status" % (controller_ip, http_port), "controller /api/status"),
                      ("http://%s:%d/" % (controller_ip, http_port), "controller status page"),
                      ("http://%s:%d/metrics" % (worker_ips[0], worker_http), "%s /metrics" % worker_names[0])):
        try:
            status, body = fetch(url)
        except OSError as e:
            raise CheckFailed("%s (%s): %s" % (what, url, e))
        check(status == 200, "%s: HTTP %d" % (what, status))
        if url.endswith("/metrics"):
            series = [l for l in body.splitlines() if l and not l.startswith("#")]
            check(series, "%s: no samples" % what)
            log("  %s: HTTP 200, %d samples" % (what, len(series)))
        elif url.endswith("/api/status"):
            doc = json.loads(body)
            log("  %s: HTTP 200, JSON with keys %s" % (what, sorted(doc)[:8]))
        else:
            log("  %s: HTTP 200, %d bytes" % (what, len(body)))

    # Collectives along both axes of the 2x2 mesh, across the namespaces.
    r = baton("check", "--controller", address, "--mesh", MESH, "--numel", "65536", timeout=90)
    log("baton check --mesh %s: %s" % (MESH, r.stdout.strip().splitlines()[-1]))

    # A 20-step FSDP job on the namespaced fleet...
    with open(a.job_example) as f:
        text, n = re.subn(r"(?m)^steps:\s*\d+", "steps: %d" % JOB_STEPS, f.read())
    check(n == 1, "%s has no steps: line" % a.job_example)
    job = os.path.join(work, "job.textproto")
    with open(job, "w") as f:
        f.write(text)
    t0 = time.monotonic()
    r = baton("run", "--controller", address, "--output", "json", job, timeout=180)
    multihost = losses(r.stdout)
    log("baton run %s (%d steps) on the namespaced fleet: %.1f s, loss %.6f -> %.6f"
        % (JOB_EXAMPLE, JOB_STEPS, time.monotonic() - t0, multihost[0], multihost[-1]))

    # ... and on a loopback fleet started by `baton up`.
    loop_dir = os.path.join(work, "loopback")
    os.makedirs(loop_dir)
    address_file = os.path.join(loop_dir, "controller.addr")
    loop_env = {"PATH": SYSTEM_PATH, "HOME": "/", "BATON_TOKEN_FILE": os.path.join(loop_dir, "client.token"),
                "TMPDIR": loop_dir}
    for key in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if key in os.environ:
            loop_env[key] = os.environ[key]
    with open(os.path.join(loop_dir, "up.log"), "w") as out:
        state["up"] = subprocess.Popen([a.baton, "up", "--workers", "4", "--address_file", address_file,
                                        "--controller_bin", a.controller_bin, "--worker_bin", a.worker_bin],
                                       env=loop_env, cwd=loop_dir, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)

    def up_ready():
        if state["up"].poll() is not None:
            with open(os.path.join(loop_dir, "up.log")) as f:
                raise CheckFailed("baton up exited: %s" % f.read()[-2000:])
        return os.path.exists(address_file) and open(address_file).read().strip()
    loop_address = wait_until("baton up", 60, up_ready, interval_s=0.1)
    r = run([a.baton, "run", "--controller", loop_address, "--output", "json", job], timeout=180, env=loop_env,
            what="baton run on the loopback fleet")
    loopback = losses(r.stdout)
    stop_processes([state["up"]], grace_s=10)
    diff = max(abs(x - y) for x, y in zip(multihost, loopback))
    log("loopback fleet (baton up --workers 4, %s): loss %.6f -> %.6f" % (loop_address, loopback[0], loopback[-1]))
    log("losses of the %d steps, namespaced vs loopback: max |difference| = %g" % (JOB_STEPS, diff))
    check(multihost == loopback, "the losses differ: %s vs %s" % (multihost, loopback))

    # A pulled cable: the worker is DEAD, by name, within 5 s.
    victim = len(workers) - 1
    name = worker_names[victim]
    cut = time.monotonic()
    net.set_link(worker_ns[victim], up=False)
    log("cut %s's link (%s down)" % (name, net.host_links[worker_ns[victim]]))
    seen = {}

    def victim_dead():
        ws = baton.workers()
        seen.update(ws)
        return ws.get(name, {}).get("state") == "DEAD"
    wait_until("%s reported DEAD" % name, 20, victim_dead, interval_s=0.05, on_poll=all_running)
    dead_after = time.monotonic() - cut
    log("  controller reports %s DEAD %.2f s after the cut (heartbeat age %.2f s; limit %.1f s)"
        % (name, dead_after, seen[name].get("heartbeat_age_s", float("nan")), DEAD_WITHIN_S))
    others = {n: seen[n]["state"] for n in worker_names if n != name}
    log("  the others: %s" % ", ".join("%s %s" % kv for kv in sorted(others.items())))
    check(dead_after <= DEAD_WITHIN_S, "%s reported DEAD only after %.2f s" % (name, dead_after))
    check(all(s != "DEAD" for s in others.values()), "only %s lost its link: %s" % (name, others))

    # The cable back: the worker heartbeats again, is told it was declared
    # dead, registers again under its name and keeps its rank.
    net.set_link(worker_ns[victim], up=True)
    back = time.monotonic()

    def victim_alive():
        w = baton.workers().get(name, {})
        return w if w.get("state") not in (None, "DEAD") else None
    w = wait_until("%s alive again" % name, 60, victim_alive, interval_s=0.1, on_poll=all_running)
    log("  link restored: %s %s again after %.2f s, rank %d, %s"
        % (name, w["state"], time.monotonic() - back, w["rank"], w["address"]))
    check(w["rank"] == victim, "%s came back as rank %d" % (name, w["rank"]))
    r = baton("check", "--controller", address, "--mesh", MESH, "--numel", "65536", timeout=90)
    log("baton check --mesh %s after the rejoin: %s" % (MESH, r.stdout.strip().splitlines()[-1]))

    # A container killed in its pod: the kubelet starts it again in the same
    # namespace (restartPolicy: Always), and a detached HSDP job on the fleet
    # recovers by itself - the dead worker's shards from their live replicas,
    # worker to worker (the pods share no disk) - and finishes.
    with open(a.hsdp_example) as f:
        text, n = re.subn(r"(?m)^steps:\s*\d+", "steps: %d" % RESTART_JOB_STEPS, f.read())
    check(n == 1, "%s has no steps: line" % a.hsdp_example)
    hsdp = os.path.join(work, "hsdp.textproto")
    with open(hsdp, "w") as f:
        f.write(text + "\nrestart { max_restarts: 2 backoff_ms: 100 }\n")
    job_id = baton("submit", "--controller", address, hsdp, timeout=60).stdout.strip().splitlines()[-1]

    def job_status():
        r = baton("jobs", "--controller", address, "--output", "json", timeout=10)
        return {j["job_id"]: j for j in json.loads(r.stdout).get("jobs", [])}.get(job_id, {})
    wait_until("%s past step 5" % job_id, 60, lambda: int(job_status().get("step", 0)) >= 5, interval_s=0.1,
               on_poll=all_running)
    pod = workers[1]
    killed_pid = pod.process.pid
    pod.process.kill()
    pod.process.wait(timeout=10)
    killed = time.monotonic()
    log("%s: its container killed (pid %d) during %s's step %s" % (pod.name, killed_pid, job_id,
                                                                   job_status().get("step")))
    time.sleep(0.5)  # the kubelet notices, then restarts the container
    pod.start(ip, binaries, restart=True)
    log("  the kubelet restarted it in %s: pid %d" % (pod.ns, pod.process.pid))

    def finished():
        j = job_status()
        if j.get("state") in ("JOB_FAILED", "JOB_STOPPED"):
            raise CheckFailed("%s %s: %s" % (job_id, j["state"], j.get("error")))
        return j if j.get("state") == "JOB_FINISHED" else None
    j = wait_until("%s finished" % job_id, 120, finished, interval_s=0.2, on_poll=all_running)
    restored = j.get("restored", {})
    log("  %s FINISHED %.1f s after the kill: %s restart, restored at step %s from live workers: %s bytes from "
        "peers, %s kept in place, %s from disk" % (job_id, time.monotonic() - killed, j.get("restarts"),
                                                  j.get("start_step"), restored.get("bytes_from_peers"),
                                                  restored.get("bytes_local"), restored.get("bytes")))
    check(int(j.get("restarts", 0)) == 1, "%s restarted %s times" % (job_id, j.get("restarts")))
    check(restored.get("from_peers") is True and int(restored.get("bytes", 0)) == 0,
          "%s was not restored from its live replicas: %s" % (job_id, restored))
    check(int(j.get("step", 0)) == RESTART_JOB_STEPS, "%s ended at step %s" % (job_id, j.get("step")))

    # Deleting the pods: the kubelet sends SIGTERM, readiness turns to
    # NOT_SERVING (no new calls routed there) while the daemon drains, and
    # the daemon exits before terminationGracePeriodSeconds ends in SIGKILL.
    terminated = time.monotonic()
    for pod in pods:
        pod.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    for pod in pods:
        addr, service = probes(pod)["readinessProbe"]
        status = grpc_health(addr, service)
        log("  %s after SIGTERM: readiness %s" % (pod.name, status))
        check(status == "NOT_SERVING", "%s: readiness must fail while draining, got %s" % (pod.name, status))
    for pod in pods:
        grace = pod.spec.get("terminationGracePeriodSeconds", 30)
        try:
            pod.process.wait(timeout=max(0.1, grace - (time.monotonic() - terminated)))
        except subprocess.TimeoutExpired:
            raise CheckFailed("%s still running %d s after SIGTERM: Kubernetes would SIGKILL it" % (pod.name, grace))
        exited = time.monotonic() - terminated
        log("  %s exited %d after %.1f s (terminationGracePeriodSeconds %d)" % (
            pod.name, pod.process.returncode, exited, grace))
        check(pod.process.returncode == 0, "%s exit status %d after SIGTERM" % (pod.name, pod.process.returncode))

    for pod in pods:
        parsed, total = json_lines(pod.log_path)
        log("  %s log: %d of %d lines are JSON objects (--log_format=json)" % (pod.name, parsed, total))
        check(parsed > 0, "%s wrote no JSON log line" % pod.name)


def cleanup(failure, pods, state, net, work):
    """Reports a failure with the daemons' logs, stops every process, removes
    the network; each step runs whatever happened in the one before. Returns
    what is left behind."""
    problems = []

    def step(what, fn):
        try:
            return fn()
        except Exception as e:  # keep going: the other steps must still run
            problems.append("%s: %s: %s" % (what, type(e).__name__, e))
            return None

    if failure:
        log("FAIL: %s" % failure)
        for pod in pods:
            log("---- %s (%s) log tail:\n%s" % (pod.name, pod.ns, pod.log_tail()))
        outputs = os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR")
        for pod in pods if outputs else []:
            if os.path.exists(pod.log_path):
                step("saving %s's log" % pod.name,
                     lambda pod=pod: shutil.copyfile(pod.log_path, os.path.join(outputs, pod.name + ".log")))
    processes = [p.process for p in pods if p.process is not None] + ([state["up"]] if state["up"] else [])
    killed = step("stopping the daemons", lambda: stop_processes(processes, grace_s=9))
    leftover = [p.pid for p in processes if pid_alive(p.pid)]
    if leftover:
        problems.append("processes still running: %s" % leftover)
    problems += step("removing the network", net.destroy) or []
    shutil.rmtree(work, ignore_errors=True)
    log("cleanup: %d daemons%s stopped (%s needed SIGKILL); %d namespaces, their veths, bridge %s and "
        "/etc/netns entries removed" % (len([p for p in pods if p.process is not None]),
                                         " and baton up" if state["up"] is not None else "", killed,
                                         len(net.namespaces), net.bridge))
    return problems


def main():
    parser = kube.argument_parser(__doc__)
    parser.add_argument("--examples", nargs="+", required=True, help="the files of examples/")
    a = parser.parse_args()
    for path in a.examples:
        if os.path.basename(path) == JOB_EXAMPLE:
            a.job_example = path
        if os.path.basename(path) == RESTART_EXAMPLE:
            a.hsdp_example = path
    check(getattr(a, "job_example", None), "no %s among --examples" % JOB_EXAMPLE)
    check(getattr(a, "hsdp_example", None), "no %s among --examples" % RESTART_EXAMPLE)
    for attr in ("baton", "controller_bin", "worker_bin"):
        setattr(a, attr, os.path.abspath(getattr(a, attr)))

    # What this test needs from the machine; without it, a clear skip.
    if os.geteuid() != 0:
        kube.skip(TEST, "needs root (network namespaces, a bridge, /etc/netns); running as uid %d" % os.geteuid())
    ip = ip_tool()
    if ip is None:
        kube.skip(TEST, "no ip (iproute2) to make network namespaces")
    kube.require_yaml()
    if importlib.util.find_spec("grpc") is None:  # the kubelet's gRPC probes, emulated
        log("FAIL: python3-grpcio is missing for %s (./dev.sh installs it)" % sys.executable)
        return 1
    if not kube.kubectls():
        kube.skip(TEST, "no kubectl to render deploy/k8s (not on PATH, not /usr/bin/kubectl)")
    probe = "bt%dprobe" % os.getpid()
    r = subprocess.run([ip, "netns", "add", probe], capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        kube.skip(TEST, "ip netns add fails here (%s): no network namespaces" % r.stderr.strip())
    subprocess.run([ip, "netns", "delete", probe], capture_output=True, timeout=10)

    signal.signal(signal.SIGALRM, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    signal.alarm(HARD_LIMIT_S)
    started = time.monotonic()
    Network.sweep_stale(ip)
    net = Network(ip)
    pods = []
    state = {"up": None}
    work = kube.make_temp_dir("multihost.%d." % os.getpid())
    failure = None
    try:
        scenario(a, ip, net, pods, state, work)
    except (CheckFailed, Interrupted) as e:
        failure = str(e)
    except Exception as e:  # a bug here must still clean up and say what
        failure = "%s: %s" % (type(e).__name__, e)
    finally:
        # Nothing may interrupt the cleanup; Bazel's SIGKILL after its grace
        # period still takes the daemons along (PR_SET_PDEATHSIG).
        signal.alarm(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        problems = cleanup(failure, pods, state, net, work)
        if problems:
            failure = (failure or "") + " cleanup incomplete: %s" % "; ".join(problems)
            log("FAIL: cleanup incomplete: %s" % "; ".join(problems))
    log("%s in %.1f s" % ("FAILED" if failure else "PASSED", time.monotonic() - started))
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
