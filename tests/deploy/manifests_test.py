"""deploy/k8s, rendered: renders overlays/cpu and overlays/gpu with kubectl
kustomize (every kubectl in $BATON_TEST_KUBECTLS, e.g. a current one and
kubectl 1.20 with kustomize v2.0.3; else the one on PATH) and checks what
the cluster would get: the objects, ports, probes, security settings,
volumes, the GPU overlay's additions, and that every --flag a container
passes is one its binary accepts (from the Bazel-built binary's --helpfull).
Prints each figure it checks. Skips, saying so, when there is no kubectl.

  manifests_test.py --baton B --controller_bin C --worker_bin W --k8s FILE...
"""

import os
import shutil
import sys

# kube.py sits beside this script; no bytecode written into the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kube  # noqa: E402
from kube import check, log  # noqa: E402

TEST = "manifests_test"
NAMESPACE = "baton"
CONTROLLER, WORKER = "baton-controller", "baton-worker"
CONTROLLER_PORTS = {"grpc": 50051, "http": 8080}
WORKER_PORTS = {"grpc": 50052, "http": 8081}
WORKERS = 4
USER = 10001
SECRET = "baton-tokens"


def ports_of(c):
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def args_dict(args):
    out = {}
    for a in args:
        name = kube.flag_name(a)
        if name is not None:
            out[name] = a.split("=", 1)[1] if "=" in a else ""
    return out


def check_service(objects, name, ports, headless):
    svc = kube.one(objects, "Service", name)
    spec = svc["spec"]
    got = {p["name"]: (p["port"], p.get("targetPort")) for p in spec["ports"]}
    log("  Service %s: ports %s, clusterIP %s, publishNotReadyAddresses %s"
        % (name, ", ".join("%s %d->%s" % (k, v[0], v[1]) for k, v in sorted(got.items())),
           spec.get("clusterIP", "(allocated)"), spec.get("publishNotReadyAddresses", False)))
    check({k: v[0] for k, v in got.items()} == ports,
          "Service %s ports %s, expected %s" % (name, got, ports))
    if headless:
        check(spec.get("clusterIP") == "None", "Service %s must be headless (clusterIP: None)" % name)
        check(spec.get("publishNotReadyAddresses") is True,
              "Service %s must publish not-ready addresses" % name)
    else:
        check(spec.get("clusterIP") != "None", "Service %s must have a cluster IP" % name)
    return svc


def check_selects(svc, workload):
    """The Service and the workload's selector pick the workload's pods."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    for what, selector in (("Service %s" % svc["metadata"]["name"], svc["spec"]["selector"]),
                           ("%s selector" % workload["metadata"]["name"],
                            workload["spec"]["selector"]["matchLabels"])):
        missing = {k: v for k, v in selector.items() if labels.get(k) != v}
        check(not missing, "%s selects %s, which the pods do not carry" % (what, missing))
    log("  selector %s matches the pod labels" % svc["spec"]["selector"])


def check_probes(c, port):
    probes = {k: c.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe") if c.get(k)}
    check("readinessProbe" in probes and "livenessProbe" in probes,
          "%s needs readiness and liveness probes, has %s" % (c["name"], sorted(probes)))
    for kind, probe in sorted(probes.items()):
        handlers = [h for h in ("grpc", "httpGet", "tcpSocket", "exec") if h in probe]
        check(handlers == ["grpc"], "%s %s uses %s, expected a gRPC probe" % (c["name"], kind, handlers))
        check(probe["grpc"].get("port") == port,
              "%s %s probes port %s, expected %d" % (c["name"], kind, probe["grpc"].get("port"), port))
        check(probe["grpc"].get("service", "") == "",
              "%s %s asks for service %r; the daemons report health under ''" % (
                  c["name"], kind, probe["grpc"].get("service")))
        log("  %s %s: grpc port %d (grpc.health.v1), period %ss, failureThreshold %s"
            % (c["name"], kind, probe["grpc"]["port"], probe.get("periodSeconds", 10),
               probe.get("failureThreshold", 3)))


def check_security(workload):
    spec = kube.pod_spec(workload)
    sc = spec.get("securityContext", {})
    log("  %s pod securityContext: runAsUser %s runAsGroup %s fsGroup %s runAsNonRoot %s"
        % (workload["metadata"]["name"], sc.get("runAsUser"), sc.get("runAsGroup"), sc.get("fsGroup"),
           sc.get("runAsNonRoot")))
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        check(sc.get(key) == USER, "%s %s is %s, expected %d" % (workload["metadata"]["name"], key,
                                                                 sc.get(key), USER))
    check(sc.get("runAsNonRoot") is True, "runAsNonRoot must be true")
    for c in spec.get("initContainers", []) + spec["containers"]:
        csc = c.get("securityContext", {})
        check(csc.get("allowPrivilegeEscalation") is False,
              "%s: allowPrivilegeEscalation must be false" % c["name"])
        check(csc.get("readOnlyRootFilesystem") is True, "%s: readOnlyRootFilesystem must be true" % c["name"])
        check(csc.get("capabilities", {}).get("drop") == ["ALL"], "%s: capabilities must drop ALL" % c["name"])
        check(not csc.get("capabilities", {}).get("add"), "%s: adds capabilities" % c["name"])
        check(not csc.get("privileged"), "%s: privileged" % c["name"])
        res = c.get("resources", {})
        check(res.get("requests") and res.get("limits"), "%s: needs resource requests and limits" % c["name"])
        log("    container %s: no privilege escalation, read-only root, capabilities drop ALL; "
            "requests %s limits %s" % (c["name"], res["requests"], res["limits"]))


def check_tokens(workload, main, args, want_keys):
    """The Secret baton-tokens reaches the pod with exactly want_keys, is
    copied by an init container into a volume the daemon reads, and every
    token flag names a file that copy writes."""
    spec = kube.pod_spec(workload)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    secret_volumes = [v for v in volumes.values() if "secret" in v]
    check(len(secret_volumes) == 1, "%s mounts %d Secret volumes, expected one"
          % (workload["metadata"]["name"], len(secret_volumes)))
    sv = secret_volumes[0]["secret"]
    check(sv["secretName"] == SECRET, "Secret volume names %s, expected %s" % (sv["secretName"], SECRET))
    keys = sorted(i["key"] for i in sv.get("items", []))
    check(keys == sorted(want_keys), "%s gets Secret keys %s, expected only %s"
          % (workload["metadata"]["name"], keys or "(all)", sorted(want_keys)))
    mode = sv.get("defaultMode")
    check(mode is not None and mode & 0o077 == 0, "Secret defaultMode %s lets others read" % mode)
    log("  %s: Secret %s keys %s, defaultMode %04o" % (workload["metadata"]["name"], SECRET, keys, mode))
    # The daemon itself never sees the Secret's root-owned files.
    secret_name = secret_volumes[0]["name"]
    mounts_of = lambda c: {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    check(secret_name not in mounts_of(main), "%s mounts the Secret itself" % main["name"])
    inits = spec.get("initContainers", [])
    copier = [c for c in inits if secret_name in mounts_of(c)]
    check(len(copier) == 1, "no init container copies the tokens")
    script = " ".join(str(a) for a in copier[0].get("command", []) + copier[0].get("args", []))
    token_flags = {k: v for k, v in args.items() if k.endswith("token_file")}
    check(len(token_flags) == len(want_keys), "%s token flags %s for keys %s"
          % (main["name"], sorted(token_flags), want_keys))
    main_mounts = mounts_of(main)
    for flag, path in sorted(token_flags.items()):
        check(path in script, "--%s=%s: the init container does not write it (%s)" % (flag, path, script))
        volume = [n for n, p in main_mounts.items() if path.startswith(p.rstrip("/") + "/")]
        check(len(volume) == 1 and volume[0] in mounts_of(copier[0]),
              "--%s=%s is not on a volume the init container fills" % (flag, path))
        check("emptyDir" in volumes[volume[0]] and volumes[volume[0]]["emptyDir"].get("medium") == "Memory",
              "token volume %s must be a memory-backed emptyDir" % volume[0])
        log("    --%s=%s: written by init container %s (mode 0400, owned by the pod's user) on "
            "in-memory volume %s" % (flag, path, copier[0]["name"], volume[0]))
    check("-m 0400" in script or "-m 0600" in script or "-m 400" in script or "-m 600" in script,
          "the init container must make the token files 0600 or stricter: %s" % script)


def check_mounted(main, args, flag):
    path = args.get(flag)
    check(path, "%s has no --%s" % (main["name"], flag))
    mounts = [m["mountPath"] for m in main.get("volumeMounts", [])]
    check(any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts),
          "--%s=%s is on the read-only root filesystem, not on a volume" % (flag, path))
    log("    --%s=%s is on a volume" % (flag, path))


def check_flags(c, binary, flags_cache):
    args = [str(a) for a in c.get("args", [])]
    if binary not in flags_cache:
        flags_cache[binary] = kube.accepted_flags(binary)
    accepted = flags_cache[binary]
    bad = kube.unknown_flags(args, accepted)
    check(not bad, "%s passes flags %s that %s does not define (it defines: %s)"
          % (c["name"], bad, os.path.basename(binary), ", ".join(sorted(accepted))))
    log("  %s: all %d flags accepted by %s (%d flags defined): %s"
        % (c["name"], len([a for a in args if kube.flag_name(a)]), os.path.basename(binary),
           len(accepted), " ".join(kube.flag_name(a) for a in args if kube.flag_name(a))))


def check_env_refs(c):
    env = {e["name"]: e for e in c.get("env", [])}
    for a in [str(x) for x in c.get("command", []) + c.get("args", [])]:
        for var in kube.references(a):
            check(var in env, "%s: %s refers to $(%s), which is not in its env" % (c["name"], a, var))


def check_overlay(kubectl, k8s_dir, overlay, binaries, flags_cache):
    log("overlays/%s with %s (%s):" % (overlay, kubectl, kube.kubectl_version(kubectl)))
    objects = kube.render(kubectl, os.path.join(k8s_dir, "overlays", overlay))
    kinds = sorted("%s/%s" % (o["kind"], o["metadata"]["name"]) for o in objects)
    log("  %d objects: %s" % (len(objects), ", ".join(kinds)))
    check(kinds == sorted(["Deployment/" + CONTROLLER, "StatefulSet/" + WORKER, "Service/" + CONTROLLER,
                           "Service/" + WORKER]),
          "expected a Deployment, a StatefulSet and 2 Services, got %s" % kinds)
    check(not kube.find(objects, "Secret"), "the tokens Secret must not come from the repository")
    namespaces = sorted({o["metadata"].get("namespace", "") for o in objects})
    log("  namespace: %s" % namespaces)
    check(namespaces == [NAMESPACE], "every object belongs in namespace %s, got %s" % (NAMESPACE, namespaces))

    # Services.
    controller_svc = check_service(objects, CONTROLLER, CONTROLLER_PORTS, headless=False)
    worker_svc = check_service(objects, WORKER, WORKER_PORTS, headless=True)

    # The controller Deployment.
    dep = kube.one(objects, "Deployment", CONTROLLER)
    check(dep["spec"]["replicas"] == 1, "the controller must have 1 replica")
    strategy = dep["spec"].get("strategy", {}).get("type", "RollingUpdate")
    log("  Deployment %s: replicas %d, strategy %s" % (CONTROLLER, dep["spec"]["replicas"], strategy))
    check(strategy == "Recreate", "two controllers must never run at once (strategy Recreate)")
    check_selects(controller_svc, dep)

    # The worker StatefulSet.
    sts = kube.one(objects, "StatefulSet", WORKER)
    spec = sts["spec"]
    log("  StatefulSet %s: replicas %d, podManagementPolicy %s, serviceName %s"
        % (WORKER, spec["replicas"], spec.get("podManagementPolicy"), spec.get("serviceName")))
    check(spec["replicas"] == WORKERS, "expected %d workers" % WORKERS)
    check(spec.get("podManagementPolicy") == "Parallel", "workers start in parallel")
    check(spec.get("serviceName") == WORKER, "the StatefulSet's serviceName is the headless Service")
    # kustomize v2.0.3's commonLabels used to add a volumeClaimTemplates map.
    check(isinstance(spec.get("volumeClaimTemplates", []), list), "volumeClaimTemplates is not a list")
    check_selects(worker_svc, sts)

    images = {}
    for name, workload, ports, binary in ((CONTROLLER, dep, CONTROLLER_PORTS, binaries["baton-controller"]),
                                          (WORKER, sts, WORKER_PORTS, binaries["baton-worker"])):
        c = kube.container(workload)
        pod = kube.pod_spec(workload)
        command = [str(x) for x in c.get("command", [])]
        check(command == ["/usr/local/bin/" + name], "%s command %s" % (name, command))
        args = args_dict([str(a) for a in c.get("args", [])])
        log("  %s container %s: %s %s" % (name, c["name"], " ".join(command), " ".join(c.get("args", []))))
        check(ports_of(c) == ports, "%s container ports %s, expected %s" % (name, ports_of(c), ports))
        check(args.get("port") == str(ports["grpc"]), "%s --port=%s, container port %d"
              % (name, args.get("port"), ports["grpc"]))
        check(args.get("http_port") == str(ports["http"]), "%s --http_port=%s, container port %d"
              % (name, args.get("http_port"), ports["http"]))
        check(args.get("log_format") == "json", "%s logs JSON" % name)
        check_probes(c, ports["grpc"])
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        log("  %s prometheus.io: scrape %s port %s path %s" % (
            name, annotations.get("prometheus.io/scrape"), annotations.get("prometheus.io/port"),
            annotations.get("prometheus.io/path")))
        check(annotations.get("prometheus.io/scrape") == "true", "%s: prometheus.io/scrape" % name)
        check(annotations.get("prometheus.io/port") == str(ports["http"]),
              "%s: prometheus.io/port must be the http port %d" % (name, ports["http"]))
        drain_ms = int(args.get("drain_ms", "0"))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        log("  %s: --drain_ms=%d, terminationGracePeriodSeconds %d" % (name, drain_ms, grace))
        check(drain_ms > 0 and drain_ms < grace * 1000,
              "%s: the drain (%d ms) must end within the grace period (%d s)" % (name, drain_ms, grace))
        check(pod.get("automountServiceAccountToken") is False, "%s needs no API token" % name)
        check_security(workload)
        check_env_refs(c)
        check_flags(c, binary, flags_cache)
        for ic in pod.get("initContainers", []):
            images[ic["image"]] = images.get(ic["image"], 0) + 1
        images[c["image"]] = images.get(c["image"], 0) + 1

        if name == CONTROLLER:
            check(args.get("host") == "0.0.0.0", "the controller serves every interface")
            check_tokens(workload, c, args, ["client.token", "worker.token"])
            check_mounted(c, args, "checkpoint_root")
        else:
            env = {e["name"]: e for e in c.get("env", [])}
            for var, path in (("POD_NAME", "metadata.name"), ("POD_IP", "status.podIP")):
                check(env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == path,
                      "worker env %s must come from %s" % (var, path))
            check(args.get("name") == "$(POD_NAME)", "a worker registers under its pod name (ordinal = rank)")
            check(args.get("host") == "$(POD_IP)", "a worker binds and advertises its pod IP")
            want = "%s:%d" % (CONTROLLER, CONTROLLER_PORTS["grpc"])
            check(args.get("controller") == want, "workers reach the controller Service at %s" % want)
            log("  worker --name=$(POD_NAME) (metadata.name), --host=$(POD_IP) (status.podIP), "
                "--controller=%s (Service %s port grpc)" % (args["controller"], CONTROLLER))
            check_tokens(workload, c, args, ["worker.token"])
            check_mounted(c, args, "checkpoint_root")
            check_mounted(c, args, "data_root")

    # The overlay's own additions.
    tag = {"cpu": "cpu", "gpu": "cuda"}[overlay]
    log("  images: %s" % ", ".join("%s x%d" % kv for kv in sorted(images.items())))
    check(all(i.rsplit(":", 1)[-1] == tag for i in images), "every image is tagged %s" % tag)
    wc = kube.container(sts)
    cc = kube.container(dep)
    limits = wc.get("resources", {}).get("limits", {})
    worker_env = {e["name"]: e.get("value") for e in wc.get("env", [])}
    controller_backend = [a for a in cc.get("args", []) if a.startswith("--default_backend=")]
    log("  worker nvidia.com/gpu: limit %s; env NCCL_SOCKET_IFNAME %s NCCL_DEBUG %s; controller %s"
        % (limits.get("nvidia.com/gpu"), worker_env.get("NCCL_SOCKET_IFNAME"), worker_env.get("NCCL_DEBUG"),
           controller_backend or "default backend (gloo)"))
    if overlay == "gpu":
        check(str(limits.get("nvidia.com/gpu")) == "1", "a GPU worker asks for nvidia.com/gpu: 1")
        check(controller_backend == ["--default_backend=nccl"], "the GPU fleet's controller selects NCCL")
        check(worker_env.get("NCCL_SOCKET_IFNAME") == "eth0", "NCCL uses the pod network (eth0)")
        check("NCCL_DEBUG" in worker_env, "NCCL_DEBUG is set")
        pod = kube.pod_spec(sts)
        log("  worker nodeSelector %s, tolerations %s" % (pod.get("nodeSelector"), pod.get("tolerations")))
        check(pod.get("nodeSelector") or pod.get("affinity"), "GPU workers go to GPU nodes")
        check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
              "GPU workers tolerate the GPU nodes' taint")
        check(not kube.container(dep).get("resources", {}).get("limits", {}).get("nvidia.com/gpu"),
              "the controller needs no GPU")
    else:
        check("nvidia.com/gpu" not in limits, "the CPU fleet asks for no GPU")
        check(not controller_backend, "the CPU fleet uses the default backend (gloo)")
    return objects


def main():
    parser = kube.argument_parser(__doc__)
    a = parser.parse_args()
    kube.require_yaml()
    kubectls = kube.kubectls()
    if not kubectls:
        kube.skip(TEST, "no kubectl (not on PATH, not /usr/bin/kubectl; BATON_TEST_KUBECTLS unset): "
                        "deploy/k8s was not rendered")
    binaries = {"baton": a.baton, "baton-controller": a.controller_bin, "baton-worker": a.worker_bin}
    staging = kube.make_temp_dir("k8s.")
    k8s_dir = kube.staged_k8s_tree(a.k8s, staging)
    flags_cache = {}
    try:
        rendered = {}
        for kubectl in kubectls:
            for overlay in ("cpu", "gpu"):
                rendered[(kubectl, overlay)] = check_overlay(kubectl, k8s_dir, overlay, binaries, flags_cache)
        if len(kubectls) > 1:
            for overlay in ("cpu", "gpu"):
                first = rendered[(kubectls[0], overlay)]
                for other in kubectls[1:]:
                    check(rendered[(other, overlay)] == first,
                          "overlays/%s renders differently with %s and %s" % (overlay, kubectls[0], other))
                log("overlays/%s: identical objects from all %d kubectls" % (overlay, len(kubectls)))
    except kube.CheckFailed as e:
        log("FAIL: %s" % e)
        return 1
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log("PASS: %d overlays x %d kubectl(s) checked" % (2, len(kubectls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
