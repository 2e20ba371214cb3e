"""What the deploy tests share: rendering deploy/k8s with kubectl kustomize,
reading pod specs out of the rendered objects, expanding a container's
command line the way Kubernetes does, the flags a binary accepts, and
reporting a skip to Bazel.

Runs on Debian's /usr/bin/python3 with python3-yaml; nothing else.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pragma: no cover - reported by the tests themselves
    yaml = None


def argument_parser(description):
    """The arguments both deploy tests take: the three binaries and deploy/k8s's files."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--baton", required=True)
    parser.add_argument("--controller_bin", required=True)
    parser.add_argument("--worker_bin", required=True)
    parser.add_argument("--k8s", nargs="+", required=True, help="the files of deploy/k8s")
    return parser


def log(*parts):
    """Prints one line at once (the test log interleaves several sources).
    A closed stdout (a reader that went away) must not stop a test midway,
    least of all its cleanup: the line is dropped."""
    try:
        print(*parts, flush=True)
    except OSError:
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass


def require_yaml():
    if yaml is None:
        log("FAIL: python3-yaml is missing for %s (./dev.sh installs it: apt-get install python3-yaml)"
            % sys.executable)
        sys.exit(1)


def skip(test_name, reason):
    """Ends the test as skipped: exit 0, with a JUnit file saying "skipped" so
    that ./dev.sh counts it among the skipped, not the passed."""
    log("SKIP: %s" % reason)
    xml_path = os.environ.get("XML_OUTPUT_FILE")
    if xml_path:
        message = (reason.replace("&", "&amp;").replace("<", "&lt;")
                   .replace(">", "&gt;").replace('"', "&quot;"))
        with open(xml_path, "w") as f:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n'
                    '<testsuites tests="1" failures="0" errors="0">\n'
                    '<testsuite name="%s" tests="1" failures="0" errors="0" skipped="1">\n'
                    '<testcase name="%s" classname="deploy" status="run" result="skipped">'
                    '<skipped message="%s"/></testcase>\n'
                    '</testsuite>\n</testsuites>\n' % (test_name, test_name, message))
    sys.exit(0)


class CheckFailed(Exception):
    pass


def check(condition, what):
    """Raises CheckFailed(what) unless condition holds."""
    if not condition:
        raise CheckFailed(what)


# ---------------------------------------------------------------- kubectl

def kubectls():
    """The kubectl binaries to render with: $BATON_TEST_KUBECTLS (colon
    separated; e.g. a current one and kubectl 1.20, whose embedded kustomize
    is v2.0.3), else the one on PATH or /usr/bin/kubectl. Empty if none."""
    listed = os.environ.get("BATON_TEST_KUBECTLS", "")
    if listed:
        found = [p for p in listed.split(":") if p]
        for p in found:
            if not os.access(p, os.X_OK):
                raise CheckFailed("BATON_TEST_KUBECTLS names %s, which is not an executable" % p)
        return found
    for candidate in (shutil.which("kubectl"), "/usr/bin/kubectl", "/usr/local/bin/kubectl"):
        if candidate and os.access(candidate, os.X_OK):
            return [candidate]
    return []


def kubectl_version(kubectl):
    """"v1.32.4 (kustomize v5.5.0)" or what the binary says, on one line."""
    try:
        out = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return "unknown (%s)" % e
    client = re.search(r'GitVersion:"(v[^"]+)"', out) or re.search(r"Client Version: (\S+)", out)
    kustomize = re.search(r"Kustomize Version: (\S+)", out)
    text = client.group(1) if client else out.strip().splitlines()[0] if out.strip() else "unknown"
    if kustomize:
        text += " (kustomize %s)" % kustomize.group(1)
    return text


def staged_k8s_tree(files, dest):
    """Copies deploy/k8s (given as its files, from the runfiles) to dest as
    plain files, and returns dest's k8s directory. kustomize refuses files
    that are symlinks out of a kustomization's directory, which is all a
    runfiles tree is made of."""
    root = None
    for f in files:
        norm = f.replace(os.sep, "/")
        i = norm.rfind("deploy/k8s/")
        check(i >= 0, "%s is not under deploy/k8s" % f)
        root = norm[:i] + "deploy/k8s"
        rel = norm[i + len("deploy/k8s/"):]
        target = os.path.join(dest, "k8s", rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(f, target)
    check(root is not None, "no deploy/k8s files given")
    return os.path.join(dest, "k8s")


def render(kubectl, kustomization_dir):
    """kubectl kustomize DIR, parsed: a list of objects."""
    require_yaml()
    try:
        r = subprocess.run([kubectl, "kustomize", kustomization_dir], capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        raise CheckFailed("%s kustomize %s took more than 120 s" % (kubectl, kustomization_dir))
    if r.returncode != 0:
        raise CheckFailed("%s kustomize %s failed (exit %d):\n%s" % (kubectl, kustomization_dir,
                                                                     r.returncode, r.stderr))
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def find(objects, kind, name=None):
    """The objects of a kind (and name)."""
    return [o for o in objects
            if o.get("kind") == kind and (name is None or o.get("metadata", {}).get("name") == name)]


def one(objects, kind, name):
    found = find(objects, kind, name)
    check(len(found) == 1, "expected exactly one %s %s, found %d" % (kind, name, len(found)))
    return found[0]


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def container(workload, name=None):
    """The workload's (only, or named) container."""
    containers = pod_spec(workload)["containers"]
    if name is None:
        check(len(containers) == 1, "%s has %d containers, expected one"
              % (workload["metadata"]["name"], len(containers)))
        return containers[0]
    matching = [c for c in containers if c["name"] == name]
    check(len(matching) == 1, "%s has no container %s" % (workload["metadata"]["name"], name))
    return matching[0]


# ------------------------------------------------------- Kubernetes semantics

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text, env):
    """Kubernetes' $(VAR) expansion of command, args and env values: $(VAR)
    becomes VAR's value when VAR is defined, stays as written otherwise;
    $$ is an escaped $."""
    def one_ref(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _VAR.sub(one_ref, text)


def references(text):
    """The variables a string refers to with $(VAR)."""
    return [m.group(1) for m in _VAR.finditer(text) if m.group(1)]


def container_env(c, pod_fields, secrets=None):
    """A container's environment as the kubelet builds it, in order: literal
    values (expanded against the variables before them) and downward-API
    fields. pod_fields maps a fieldPath (metadata.name, status.podIP, ...) to
    its value; secrets maps secretName -> {key: value}."""
    env = {}
    for e in c.get("env", []):
        name = e["name"]
        if "value" in e:
            env[name] = expand(str(e["value"]), env)
        elif "valueFrom" in e:
            source = e["valueFrom"]
            if "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                check(path in pod_fields, "env %s: fieldRef %s is not emulated" % (name, path))
                env[name] = pod_fields[path]
            elif "secretKeyRef" in source and secrets is not None:
                ref = source["secretKeyRef"]
                env[name] = secrets[ref["name"]][ref["key"]]
            else:
                raise CheckFailed("env %s: valueFrom %s is not emulated" % (name, sorted(source)))
        else:
            env[name] = ""
    check(not c.get("envFrom"), "envFrom is not emulated")
    return env


def command_line(c, env):
    """command + args with $(VAR) expanded, as the container runs them."""
    return [expand(str(a), env) for a in list(c.get("command", [])) + list(c.get("args", []))]


def replace_mount_paths(text, mounts):
    """Rewrites every path under a mount point to the directory standing in
    for it, in one pass (a rewritten path is not rewritten again, e.g. by a
    mount at /tmp), the longest mount point first. A path counts where it
    starts: at the beginning, after "=", a space, a quote... mounts:
    {mountPath: host directory}."""
    if not mounts:
        return text
    by_path = {m.rstrip("/") or "/": d for m, d in mounts.items()}
    alternatives = "|".join(re.escape(m) for m in sorted(by_path, key=len, reverse=True))
    pattern = r"(?<![A-Za-z0-9_./-])(%s)(?=/|$|[^A-Za-z0-9_.-])" % alternatives
    return re.sub(pattern, lambda m: by_path[m.group(1)], text)


# ------------------------------------------------------------------- flags

_FLAG_LINE = re.compile(r"^\s+--([A-Za-z0-9_]+)\b")


def accepted_flags(binary):
    """The flags an Abseil binary accepts, from its --helpfull (which exits 1
    after printing). Boolean flags also accept --noNAME."""
    try:
        r = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise CheckFailed("%s --helpfull took more than 30 s" % binary)
    flags = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = _FLAG_LINE.match(line)
        if m:
            flags[m.group(1)] = line
    check(flags, "%s --helpfull listed no flags (exit %d): %s" % (binary, r.returncode,
                                                                 (r.stdout + r.stderr)[:500]))
    return set(flags)


def flag_name(arg):
    """"--name=value" or "--name" -> "name"; None for a positional argument."""
    if not arg.startswith("--") or arg == "--":
        return None
    return arg[2:].split("=", 1)[0]


def unknown_flags(args, flags):
    """The --flags of args that the binary does not define."""
    bad = []
    for a in args:
        name = flag_name(a)
        if name is None:
            continue
        if name in flags or (name.startswith("no") and name[2:] in flags and "=" not in a):
            continue
        bad.append(a)
    return bad


def make_temp_dir(prefix):
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))
