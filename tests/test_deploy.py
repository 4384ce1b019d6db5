"""The deployment files under deploy/: Kubernetes (kustomize), monitoring, systemd, Dockerfile.

Each overlay is rendered with ``kubectl kustomize`` and every object, with every
example, is validated against the newest Kubernetes schema kubernetes-validate has
(strict: unknown fields are errors). Then the properties the manifests promise are
checked on the rendered objects: the CSI node plugin's sockets, host paths and mount
propagation; tokens only from Secrets; pinned images; every ``fabric`` flag real;
Services that select pods; scrape jobs that find the pods. Metric names in the alert
rules and the dashboard are checked against the /metrics of a real hub and spoke.
The checkers are also run on broken inputs, so that each can be seen to fail.

Missing tools (kubectl, promtool, systemd-analyze) skip their tests, and fail them
under CI (tests/ci_requirements.py).
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import kubernetes_validate
import pytest
import yaml

from tests.ci_requirements import missing, requires
from tests.hubserver import Hub, unique_name
from tests.spokeserver import start_spoke

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
MONITORING = DEPLOY / "monitoring"
SYSTEMD = DEPLOY / "systemd"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))
KUBE_VERSION = kubernetes_validate.latest_version()  # the newest schema the package has

IMAGE = "ghcr.io/fabric-data/fabric"
DRIVER = "csi.fabric.dev"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod", "ReplicaSet")
SECRET_WORDS = re.compile(r"TOKEN|PASSWORD|SECRET|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)

kubectl = requires(lambda: None if shutil.which("kubectl") else "kubectl is not installed: it renders the kustomize overlays (kubectl kustomize)")
promtool = requires(lambda: None if shutil.which("promtool") else "promtool is not installed (Debian package prometheus): it checks the rules and scrape config")


# -- rendering -----------------------------------------------------------------------------------


@functools.cache
def _render(overlay: str) -> tuple[dict, ...]:
    done = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize overlays/{overlay} failed:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render(overlay: str) -> list[dict]:
    """The objects of an overlay (fresh copies: tests may change them)."""
    if not shutil.which("kubectl"):
        missing("kubectl is not installed: it renders the kustomize overlays (kubectl kustomize)")
    return copy.deepcopy(list(_render(overlay)))


def load_examples() -> list[tuple[str, dict]]:
    out = []
    for path in EXAMPLES:
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def find(objs: list[dict], kind: str, name: str) -> dict:
    hits = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind} {name}, found {len(hits)}"
    return hits[0]


def pod_spec(obj: dict) -> dict | None:
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if obj["kind"] in WORKLOADS:
        return obj["spec"]["template"]["spec"]
    return None


def containers(spec: dict) -> list[dict]:
    return list(spec.get("initContainers", [])) + list(spec.get("containers", []))


def container(spec: dict, name: str) -> dict:
    hits = [c for c in containers(spec) if c["name"] == name]
    assert len(hits) == 1, f"expected one container {name}, found {[c['name'] for c in containers(spec)]}"
    return hits[0]


def flags(c: dict) -> dict[str, str | None]:
    """``--name=value`` (and bare ``--name``) arguments of a container."""
    out: dict[str, str | None] = {}
    for arg in c.get("args", []):
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            out[name] = value if eq else None
    return out


def mount_at(spec: dict, c: dict, path: str) -> tuple[dict, dict]:
    """The volumeMount of container ``c`` at ``path`` and the pod volume behind it."""
    mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == path]
    assert len(mounts) == 1, f"container {c['name']} has no single mount at {path}"
    volumes = [v for v in spec.get("volumes", []) if v["name"] == mounts[0]["name"]]
    assert len(volumes) == 1, f"volume {mounts[0]['name']} is not in the pod"
    return mounts[0], volumes[0]


def host_path(spec: dict, c: dict, path: str) -> str | None:
    return mount_at(spec, c, path)[1].get("hostPath", {}).get("path")


def env_of(c: dict, name: str) -> dict:
    hits = [e for e in c.get("env", []) if e["name"] == name]
    assert len(hits) == 1, f"container {c['name']} has no single env var {name}"
    return hits[0]


def all_objects() -> Iterator[tuple[str, dict]]:
    """Every object of every overlay, and every example."""
    for overlay in OVERLAYS:
        for obj in render(overlay):
            yield f"overlays/{overlay}", obj
    for name, obj in load_examples():
        yield f"examples/{name}", obj


# -- the overlays render and validate --------------------------------------------------------------


def validation_errors(obj: dict) -> list[str]:
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{obj['kind']} {obj['metadata'].get('name')}: {exc.message} at {'/'.join(map(str, exc.path))}"]
    return []


@kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_validates(overlay: str) -> None:
    objs = render(overlay)
    assert objs, f"overlays/{overlay} renders nothing"
    problems = [p for obj in objs for p in validation_errors(obj)]
    assert not problems, f"overlays/{overlay} against Kubernetes {KUBE_VERSION} (strict):\n" + "\n".join(problems)
    for obj in objs:  # everything namespaced lands in namespace fabric
        if obj["kind"] not in ("Namespace", "CSIDriver", "ClusterRole", "ClusterRoleBinding", "StorageClass", "PersistentVolume"):
            assert obj["metadata"].get("namespace") == "fabric", f"{obj['kind']} {obj['metadata']['name']} is not in namespace fabric"
    find(objs, "Namespace", "fabric")
    find(objs, "CSIDriver", DRIVER)


@kubectl
def test_default_overlay_has_hub_spoke_csi_and_monitoring() -> None:
    objs = render("default")
    for kind, name in [
        ("StatefulSet", "fabric-hub"), ("Service", "fabric-hub"), ("DaemonSet", "fabric-spoke"), ("Service", "fabric-spoke"),
        ("DaemonSet", "fabric-csi-node"), ("DaemonSet", "fabric-csi-mounter"), ("Deployment", "fabric-csi-controller"),
        ("ConfigMap", "fabric-grafana-dashboard"), ("ConfigMap", "fabric-prometheus-rules"), ("ConfigMap", "fabric-prometheus-scrape"),
    ]:
        find(objs, kind, name)
    dash = find(objs, "ConfigMap", "fabric-grafana-dashboard")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dash["data"]["fabric.json"]) == json.loads((MONITORING / "grafana-dashboard.json").read_text())


def test_examples_validate() -> None:
    examples = load_examples()
    kinds = {o["kind"] for _, o in examples}
    assert {"StorageClass", "PersistentVolume", "PersistentVolumeClaim", "Pod", "Secret"} <= kinds
    problems = [f"{name}: {p}" for name, obj in examples for p in validation_errors(obj)]
    assert not problems, "\n".join(problems)


def test_strict_validation_rejects_unknown_fields_and_wrong_types() -> None:
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
          "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}}
    assert validation_errors(ds) == []
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["containers"][0]["mountPropagation"] = "Bidirectional"  # belongs in a volumeMount
    assert validation_errors(bad)
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["hostPID"] = "yes"
    assert validation_errors(bad)


# -- examples: the volume model ----------------------------------------------------------------------


def test_storage_classes_and_static_volume() -> None:
    examples = load_examples()
    classes = {o["metadata"]["name"]: o for _, o in examples if o["kind"] == "StorageClass"}
    assert set(classes) == {"fabric", "fabric-branch-per-claim"}
    for sc in classes.values():
        assert sc["provisioner"] == DRIVER
        params = sc["parameters"]
        assert set(params) - {"server", "share", "subDir", "onDelete"} <= {k for k in params if k.startswith("csi.storage.k8s.io/")}
        assert params["onDelete"] in ("retain", "delete", "archive")
        for kind in ("provisioner", "node-publish"):
            assert params[f"csi.storage.k8s.io/{kind}-secret-name"] == "fabric-token"
            assert params[f"csi.storage.k8s.io/{kind}-secret-namespace"] == "fabric"
    assert classes["fabric"]["parameters"]["subDir"] == "${pvc.metadata.namespace}/${pvc.metadata.name}"
    assert classes["fabric-branch-per-claim"]["parameters"]["share"] == "checkpoints@${pvc.metadata.name}"
    assert "subDir" not in classes["fabric-branch-per-claim"]["parameters"]
    pv = next(o for _, o in examples if o["kind"] == "PersistentVolume")
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"] and "ro" in pv["spec"]["mountOptions"]
    assert pv["spec"]["csi"]["driver"] == DRIVER and set(pv["spec"]["csi"]["volumeAttributes"]) == {"server", "share"}
    assert pv["spec"]["csi"]["nodePublishSecretRef"] == {"name": "fabric-token", "namespace": "fabric"}
    claims = {o["metadata"]["name"]: o for _, o in examples if o["kind"] == "PersistentVolumeClaim"}
    static = next(c for c in claims.values() if c["spec"].get("volumeName") == pv["metadata"]["name"])
    assert static["spec"]["storageClassName"] == ""
    dynamic = [c for c in claims.values() if c["spec"].get("storageClassName") in classes]
    assert dynamic and all(c["spec"]["accessModes"] == ["ReadWriteMany"] for c in dynamic)
    pod = next(o for _, o in examples if o["kind"] == "Pod")
    assert {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]} == {static["metadata"]["name"], *(c["metadata"]["name"] for c in dynamic)}
    secret = next(o for _, o in examples if o["kind"] == "Secret")
    assert secret["metadata"]["name"] == "fabric-token" and set(secret["stringData"]) == {"token"}


# -- the CSI driver ---------------------------------------------------------------------------------------


def csi_node_problems(objs: list[dict]) -> list[str]:
    """What is wrong with the node plugin: registrar, driver and mounter, their sockets and mounts."""
    problems: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    node = find(objs, "DaemonSet", "fabric-csi-node")["spec"]["template"]["spec"]
    mounter_ds = find(objs, "DaemonSet", "fabric-csi-mounter")
    mspec = mounter_ds["spec"]["template"]["spec"]
    reg, drv, mnt = container(node, "node-driver-registrar"), container(node, "fabric-csi"), container(mspec, "fabric-mounter")
    plugin_dir = f"/var/lib/kubelet/plugins/{DRIVER}"
    # registrar: the driver's socket, as kubelet sees it, and kubelet's registration directory
    check(reg["image"] == "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.13.0", "registrar image")
    check(flags(reg).get("--csi-address") == "/csi/csi.sock", "registrar --csi-address")
    check(flags(reg).get("--kubelet-registration-path") == f"{plugin_dir}/csi.sock", "registrar --kubelet-registration-path")
    check(host_path(node, reg, "/csi") == plugin_dir, "registrar: plugin dir at /csi")
    check(host_path(node, reg, "/registration") == "/var/lib/kubelet/plugins_registry", "registrar: registration dir")
    # driver: serves the socket the registrar names, node mode, node id from the downward API
    f = flags(drv)
    check(drv["args"][0] == "csi" and "--node" in f and "--controller" not in f, "driver: fabric csi --node")
    check(f.get("--endpoint") == "unix:///csi/csi.sock", "driver --endpoint")
    check(host_path(node, drv, "/csi") == plugin_dir, "driver: plugin dir at /csi")
    check(f.get("--node-id") == "$(NODE_NAME)" and env_of(drv, "NODE_NAME").get("valueFrom") == {"fieldRef": {"fieldPath": "spec.nodeName"}}, "driver --node-id from spec.nodeName")
    # mounter: the same socket and state directory, on the same host paths
    m = flags(mnt)
    check(mnt["args"][:2] == ["csi", "mounter"], "mounter: fabric csi mounter")
    sock = f.get("--mounter-socket") or ""
    check(bool(sock) and m.get("--socket") == sock, "driver --mounter-socket is the mounter's --socket")
    sock_dir = sock.rsplit("/", 1)[0]
    check(host_path(node, drv, sock_dir) is not None and host_path(node, drv, sock_dir) == host_path(mspec, mnt, sock_dir), "mounter socket dir: one hostPath for both")
    check(f.get("--state-dir") == m.get("--state-dir") and f.get("--state-dir") is not None, "one --state-dir")
    state = f.get("--state-dir") or "/nonexistent"
    check(host_path(node, drv, state) is not None and host_path(node, drv, state) == host_path(mspec, mnt, state), "state dir: one hostPath for both")
    # mounts reach the host from the mounter; the driver sees them
    check(mount_at(mspec, mnt, "/var/lib/kubelet")[0].get("mountPropagation") == "Bidirectional", "mounter: /var/lib/kubelet Bidirectional")
    check(host_path(mspec, mnt, "/var/lib/kubelet") == "/var/lib/kubelet", "mounter: kubelet dir")
    check(mount_at(node, drv, "/var/lib/kubelet")[0].get("mountPropagation") in ("HostToContainer", "Bidirectional"), "driver: /var/lib/kubelet propagation")
    for spec, c in ((node, drv), (mspec, mnt)):
        check(c.get("securityContext", {}).get("privileged") is True, f"{c['name']}: privileged")
        fuse = mount_at(spec, c, "/dev/fuse")[1].get("hostPath", {})
        check(fuse == {"path": "/dev/fuse", "type": "CharDevice"}, f"{c['name']}: /dev/fuse")
    # one pid namespace (the driver checks the mounter's mount processes); node-critical; every node
    for name, spec in (("fabric-csi-node", node), ("fabric-csi-mounter", mspec)):
        check(spec.get("hostPID") is True, f"{name}: hostPID")
        check(spec.get("hostNetwork", False) is False, f"{name}: pod network")
        check(spec.get("priorityClassName") == "system-node-critical", f"{name}: system-node-critical")
        check({"operator": "Exists"} in spec.get("tolerations", []), f"{name}: tolerates every taint")
    # the mounter's mounts end with its pod: it is never replaced by an apply
    check(mounter_ds["spec"].get("updateStrategy", {}).get("type") == "OnDelete", "mounter: OnDelete")
    # --local-spoke: the node's spoke's cache, read-only in the mounter, from the spoke's own hostPath
    url, _, cache = (f.get("--local-spoke") or "=").partition("=")
    check(url == "http://fabric-spoke.fabric.svc:8700", "driver --local-spoke names the fabric-spoke Service")
    spoke_cache = [m for m in mnt.get("volumeMounts", []) if m["mountPath"] == cache]
    check(len(spoke_cache) == 1 and spoke_cache[0].get("readOnly") is True, "mounter: the --local-spoke directory, read-only")
    spokes = [o for o in objs if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "fabric-spoke"]
    if spokes and spoke_cache:
        sspec = spokes[0]["spec"]["template"]["spec"]
        spoke_dir = flags(container(sspec, "spoke")).get("--cache") or "/nonexistent"
        check(host_path(mspec, mnt, cache) == host_path(sspec, container(sspec, "spoke"), spoke_dir), "mounter: --local-spoke is the spoke's cache hostPath")
    return problems


@kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_csi_node_plugin(overlay: str) -> None:
    objs = render(overlay)
    driver = find(objs, "CSIDriver", DRIVER)["spec"]
    assert driver["attachRequired"] is False and driver["podInfoOnMount"] is False
    assert driver["volumeLifecycleModes"] == ["Persistent"] and driver["fsGroupPolicy"] in ("None", "File")
    assert csi_node_problems(objs) == []


@kubectl
def test_csi_node_checker_fails_on_broken_plugins() -> None:
    def broken(change) -> list[str]:
        objs = render("default")
        change(objs)
        return csi_node_problems(objs)

    def node(objs):
        return find(objs, "DaemonSet", "fabric-csi-node")["spec"]["template"]["spec"]

    def mounter(objs):
        return find(objs, "DaemonSet", "fabric-csi-mounter")["spec"]["template"]["spec"]

    def propagation(objs):
        for m in container(mounter(objs), "fabric-mounter")["volumeMounts"]:
            m.pop("mountPropagation", None)

    def socket(objs):
        container(mounter(objs), "fabric-mounter")["args"][2] = "--socket=/tmp/other.sock"

    def emptydir(objs):
        spec = mounter(objs)
        for v in spec["volumes"]:
            if v["name"] == "mounter-dir":
                v.pop("hostPath")
                v["emptyDir"] = {}

    def registrar(objs):
        container(node(objs), "node-driver-registrar")["args"][1] = "--kubelet-registration-path=/var/lib/kubelet/plugins/other/csi.sock"

    def pid(objs):
        node(objs).pop("hostPID")

    def rolling(objs):
        find(objs, "DaemonSet", "fabric-csi-mounter")["spec"]["updateStrategy"] = {"type": "RollingUpdate"}

    def spoke_cache_elsewhere(objs):
        for v in mounter(objs)["volumes"]:
            if v["name"] == "spoke-cache":
                v["hostPath"]["path"] = "/var/lib/other"

    def spoke_cache_writable(objs):
        for m in container(mounter(objs), "fabric-mounter")["volumeMounts"]:
            if m["name"] == "spoke-cache":
                m.pop("readOnly")

    for change in (propagation, socket, emptydir, registrar, pid, rolling, spoke_cache_elsewhere, spoke_cache_writable):
        assert broken(change), f"{change.__name__}: not noticed"


RBAC_NEEDED = [  # (API group, resource, verbs) the external-provisioner needs
    ("", "persistentvolumes", {"get", "list", "watch", "create", "delete"}),
    ("", "persistentvolumeclaims", {"get", "list", "watch", "update"}),
    ("storage.k8s.io", "storageclasses", {"get", "list", "watch"}),
    ("", "events", {"list", "watch", "create", "update", "patch"}),
    ("storage.k8s.io", "csinodes", {"get", "list", "watch"}),
    ("", "nodes", {"get", "list", "watch"}),
    ("storage.k8s.io", "volumeattachments", {"get", "list", "watch"}),
    ("", "secrets", {"get"}),
]


def allowed(rules: list[dict], group: str, resource: str) -> set[str]:
    verbs: set[str] = set()
    for r in rules:
        if group in r.get("apiGroups", []) and resource in r.get("resources", []):
            verbs |= set(r["verbs"])
    return verbs


@kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_csi_controller_and_its_rbac(overlay: str) -> None:
    objs = render(overlay)
    dep = find(objs, "Deployment", "fabric-csi-controller")
    spec = dep["spec"]["template"]["spec"]
    prov, drv = container(spec, "csi-provisioner"), container(spec, "fabric-csi")
    assert prov["image"] == "registry.k8s.io/sig-storage/csi-provisioner:v5.2.0"
    p = flags(prov)
    # --extra-create-metadata: the driver fills ${pvc.metadata.name} etc. from what it passes
    assert {"--extra-create-metadata", "--leader-election"} <= set(p) and p["--csi-address"] == "/csi/csi.sock"
    d = flags(drv)
    assert drv["args"][0] == "csi" and "--controller" in d and "--node" not in d and d["--endpoint"] == "unix:///csi/csi.sock"
    assert mount_at(spec, prov, "/csi")[1] == mount_at(spec, drv, "/csi")[1] and "emptyDir" in mount_at(spec, prov, "/csi")[1]
    sa = spec["serviceAccountName"]
    find(objs, "ServiceAccount", sa)
    bound_roles = {
        (b["roleRef"]["kind"], b["roleRef"]["name"]) for b in objs if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for s in b["subjects"] if s["kind"] == "ServiceAccount" and s["name"] == sa and s.get("namespace") == "fabric"
    }
    cluster_rules = [r for kind, name in bound_roles if kind == "ClusterRole" for r in find(objs, "ClusterRole", name)["rules"]]
    for group, resource, verbs in RBAC_NEEDED:
        assert verbs <= allowed(cluster_rules, group, resource), f"{resource}: needs {sorted(verbs)}"
    role_rules = [r for kind, name in bound_roles if kind == "Role" for r in find(objs, "Role", name)["rules"]]
    assert {"get", "create", "update"} <= allowed(role_rules, "coordination.k8s.io", "leases"), "leader election needs leases"


# -- hub and spoke ---------------------------------------------------------------------------------------------


@kubectl
def test_hub_and_spoke_workloads() -> None:
    objs = render("default")
    hub = find(objs, "StatefulSet", "fabric-hub")
    spec = hub["spec"]["template"]["spec"]
    c = container(spec, "hub")
    assert hub["spec"]["replicas"] == 1
    assert c["args"][0] == "hub" and flags(c) == {"--data": "/data", "--listen": "0.0.0.0:8600", "--s3-listen": "0.0.0.0:9000"}
    assert [t["metadata"]["name"] for t in hub["spec"]["volumeClaimTemplates"]] == [m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/data"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8600, "s3": 9000}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz" and ports[c[probe]["httpGet"]["port"]] == 8600
    spoke = find(objs, "DaemonSet", "fabric-spoke")["spec"]["template"]["spec"]
    s = container(spoke, "spoke")
    assert spoke.get("hostNetwork", False) is False
    assert s["args"][0] == "spoke" and flags(s)["--hub"] == "http://fabric-hub:8600" and flags(s)["--listen"] == "0.0.0.0:8700"
    assert host_path(spoke, s, flags(s)["--cache"]) == "/var/lib/fabric/spoke-cache"
    # the spoke's token: FABRIC_TOKEN (what `fabric spoke --token` reads), from the Secret
    assert env_of(s, "FABRIC_TOKEN")["valueFrom"] == {"secretKeyRef": {"name": "fabric-spoke-token", "key": "token"}}
    assert option(["spoke"], "--token").envvar == "FABRIC_TOKEN"
    svc = find(objs, "Service", "fabric-spoke")["spec"]
    assert svc["internalTrafficPolicy"] == "Local" and [p["port"] for p in svc["ports"]] == [8700]
    for workload in (c, s):
        assert {"requests", "limits"} <= set(workload["resources"])
        sc = workload["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spoke["securityContext"]["runAsNonRoot"] is True


@kubectl
def test_production_overlay_components() -> None:
    objs = render("production")
    hub = find(objs, "StatefulSet", "fabric-hub")
    c = container(hub["spec"]["template"]["spec"], "hub")
    f = flags(c)
    assert f["--db"] == "$(FABRIC_DB_URL)" and f["--store"] == "$(FABRIC_STORE_URL)" and hub["spec"]["replicas"] == 2
    for var, secret in [("FABRIC_DB_URL", "fabric-hub-postgres"), ("PGPASSWORD", "fabric-hub-postgres"), ("FABRIC_STORE_URL", "fabric-hub-s3"),
                        ("AWS_ACCESS_KEY_ID", "fabric-hub-s3"), ("AWS_SECRET_ACCESS_KEY", "fabric-hub-s3")]:
        assert env_of(c, var)["valueFrom"]["secretKeyRef"]["name"] == secret
    spoke = find(objs, "DaemonSet", "fabric-spoke")["spec"]["template"]["spec"]
    assert spoke["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    s = flags(container(spoke, "spoke"))
    assert s["--group"] == "$(FABRIC_SPOKE_GROUP)" and s["--advertise"] == "http://$(POD_IP):8700"
    # the overlay's images: pins the fabric image everywhere, leaves the sidecars alone
    images = {c["image"] for o in objs if (sp := pod_spec(o)) for c in containers(sp)}
    assert not any(i.startswith(IMAGE + ":") for i in images) and "registry.example.com/mirror/fabric:0.1.0" in images


def service_problems(objs: list[dict]) -> list[str]:
    """Services that select no pod, or name a port no selected container has."""
    problems = []
    pods = [(o["spec"]["template"]["metadata"].get("labels", {}), pod_spec(o)) for o in objs if o["kind"] in WORKLOADS and o["kind"] != "Pod"]
    for svc in (o for o in objs if o["kind"] == "Service"):
        sel = svc["spec"].get("selector", {})
        matched = [spec for labels, spec in pods if sel and sel.items() <= labels.items()]
        if not matched:
            problems.append(f"Service {svc['metadata']['name']} selects no pod")
            continue
        names = {p.get("name") for spec in matched for c in containers(spec) for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            if isinstance(port.get("targetPort"), str) and port["targetPort"] not in names:
                problems.append(f"Service {svc['metadata']['name']}: no container port {port['targetPort']}")
    return problems


@kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_pods_and_ports(overlay: str) -> None:
    objs = render(overlay)
    assert service_problems(objs) == []
    broken = copy.deepcopy(objs)
    for o in broken:
        if o["kind"] == "Service":
            o["spec"]["selector"]["app.kubernetes.io/component"] = "nothing"
    assert service_problems(broken) or not any(o["kind"] == "Service" for o in objs)


# -- tokens and images -------------------------------------------------------------------------------------------------


def token_problems(where: str, obj: dict) -> list[str]:
    """Tokens or passwords on a command line, or in env vars that are not read from a Secret."""
    spec = pod_spec(obj)
    if spec is None:
        return []
    problems = []
    for c in containers(spec):
        env = {e["name"]: e for e in c.get("env", [])}
        for word in list(c.get("command", [])) + list(c.get("args", [])):
            if re.search(r"--token\b|--password\b|fab_[A-Za-z0-9]", word):
                problems.append(f"{where} {c['name']}: a token on the command line: {word!r}")
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word):
                if SECRET_WORDS.search(var):
                    problems.append(f"{where} {c['name']}: secret $({var}) expanded onto the command line")
        for name, e in env.items():
            if SECRET_WORDS.search(name) and "secretKeyRef" not in e.get("valueFrom", {}):
                problems.append(f"{where} {c['name']}: env {name} is not read from a Secret")
    return problems


@kubectl
def test_no_token_on_a_command_line() -> None:
    problems = [p for where, obj in all_objects() for p in token_problems(where, obj)]
    assert not problems, "\n".join(problems)
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i:1", "args": ["spoke", "--token=fab_abc_def"]}]}}
    assert token_problems("t", pod)
    pod["spec"]["containers"][0]["args"] = ["spoke", "--token", "$(TOKEN)"]
    assert token_problems("t", pod)
    pod["spec"]["containers"][0]["args"] = ["spoke"]
    pod["spec"]["containers"][0]["env"] = [{"name": "FABRIC_TOKEN", "value": "fab_abc_def"}]
    assert token_problems("t", pod)


def image_problems(where: str, obj: dict) -> list[str]:
    spec = pod_spec(obj)
    problems = []
    for c in containers(spec) if spec else []:
        image = c["image"]
        name, _, tag = image.rpartition(":") if "@" not in image else (image, "", "digest")
        if not name or "/" in tag or tag in ("", "latest"):
            problems.append(f"{where} {c['name']}: image {image!r} is not pinned to a tag")
    return problems


@kubectl
def test_every_image_is_pinned() -> None:
    problems = [p for where, obj in all_objects() for p in image_problems(where, obj)]
    assert not problems, "\n".join(problems)
    for bad in ("ghcr.io/fabric-data/fabric", "ghcr.io/fabric-data/fabric:latest", "localhost:5000/fabric"):
        pod = {"kind": "Pod", "spec": {"containers": [{"name": "c", "image": bad}]}}
        assert image_problems("t", pod), bad


# -- every `fabric` command line is one the CLI accepts ---------------------------------------------------------------------


@functools.cache
def command(path: tuple[str, ...]) -> click.Command:
    from fabric.cli.main import cli

    cmd: click.Command = cli
    for name in path:
        assert isinstance(cmd, click.Group), f"fabric {' '.join(path)}: {cmd.name} has no subcommands"
        try:
            sub = cmd.get_command(click.Context(cmd), name)
        except ImportError as exc:  # the csi extra (grpc) is not installed
            missing(f"fabric {name} cannot be loaded ({exc}); install fabric[csi]")
        assert sub is not None, f"fabric has no command {' '.join(path)}"
        cmd = sub
    return cmd


def option(path: list[str], name: str) -> click.Option:
    opts = [p for p in command(tuple(path)).params if isinstance(p, click.Option) and name in p.opts + p.secondary_opts]
    assert opts, f"fabric {' '.join(path)} has no option {name}"
    return opts[0]


def cli_problems(argv: list[str]) -> list[str]:
    """Unknown subcommands or options in ``fabric ARGV`` (values are not checked)."""
    path: list[str] = []
    while argv and not argv[0].startswith("-") and isinstance(command(tuple(path)), click.Group):
        path.append(argv.pop(0))
    cmd = command(tuple(path))
    known = {o: p for p in cmd.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
    problems = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("-"):
            continue
        name, eq, _ = word.partition("=")
        if name not in known:
            problems.append(f"fabric {' '.join(path)}: unknown option {name}")
        elif not eq and not known[name].is_flag:
            i += 1  # its value
    return problems


def fabric_command_lines() -> Iterator[tuple[str, list[str]]]:
    for where, obj in all_objects():
        spec = pod_spec(obj)
        for c in containers(spec) if spec else []:
            argv = list(c.get("command", [])) + list(c.get("args", []))
            if argv and argv[0] == "fabric":
                yield f"{where} {obj['metadata']['name']}/{c['name']}", argv[1:]
    yield from systemd_command_lines()


def systemd_command_lines() -> Iterator[tuple[str, list[str]]]:
    """The ``fabric`` command lines of the units: ``$VAR`` (flags from the environment
    file) left out, ``${VAR}`` (one value) as X."""
    for path in sorted(SYSTEMD.glob("*.service")):
        for key, value in unit_items(path):
            if key.startswith("Exec"):
                words = [w for w in shlex.split(value.lstrip("-")) if not w.startswith("$") or w.startswith("${")]
                if words and words[0].endswith("/fabric"):
                    yield f"{path.name} {key}", [re.sub(r"\$\{\w+\}", "X", w) for w in words[1:]]


@kubectl
def test_every_fabric_command_line_is_valid() -> None:
    lines = list(fabric_command_lines())
    subcommands = {argv[0] for _, argv in lines}
    assert {"hub", "spoke", "csi", "mount", "umount"} <= subcommands
    problems = [f"{where}: {p}" for where, argv in lines for p in cli_problems(list(argv))]
    assert not problems, "\n".join(problems)
    assert cli_problems(["hub", "--data=/d", "--cache-size=1G"]) == ["fabric hub: unknown option --cache-size"]
    assert cli_problems(["spoke", "--hub", "http://h", "--no-auth", "--cache", "/c"]) == []


# -- monitoring ---------------------------------------------------------------------------------------------------------------


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    out = []

    def walk(panels):
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["query"]["query"])
            assert m, var["query"]
            out.append(m.group(1))
    return out


@promtool
def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(["promtool", "check", "rules", str(MONITORING / "alerts.yaml")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_alert_rules_cover_the_failures() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for r in rules:
        assert r["expr"].strip() and r["labels"]["severity"] in ("critical", "warning", "info") and r["annotations"]["summary"], r["alert"]
    text = {r["alert"]: r["expr"] for r in rules}
    wanted = {  # failure: (alert, a metric it must read)
        "hub down": ("FabricHubDown", 'up{job="fabric-hub"}'),
        "spoke down": ("FabricSpokeDown", 'up{job="fabric-spoke"}'),
        "cache hit ratio": ("FabricSpokeCacheHitRatioLow", 'what="cache_hit_bytes"'),
        "write-back backlog": ("FabricSpokeWritebackBacklogGrowing", 'what="writeback_pending"'),
        "parked writes": ("FabricSpokeWritebackParked", 'what="writeback_parked"'),
        "hub unreachable": ("FabricSpokeHubUnreachable", 'what="hub_reachable"'),
        "p99 latency": ("FabricRequestLatencyHigh", "fabric_http_request_seconds_bucket"),
        "WAN spike": ("FabricSpokeWanBytesSpike", 'what="upstream_bytes_received"'),
    }
    for failure, (alert, needle) in wanted.items():
        assert alert in text and needle in text[alert], f"{failure}: {alert} should read {needle}"


# PromQL, enough to find the series a query reads: names and their label matchers.
_TOKEN = re.compile(
    r'\s+|(?P<str>"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')|(?P<range>\[[^\]]*\])|(?P<dur>(?:\d+(?:ms|[smhdwy]))+\b)|(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)'
    r"|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)|(?P<brace>\{[^}]*\})|(?P<op>.)"
)
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset", "inf", "nan"}
_AGGREGATORS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
#: Series Prometheus makes itself, not the targets.
SYNTHETIC = {"up"}


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in _TOKEN.finditer(expr) if m.lastgroup]
    out = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "ident" and text in ("by", "without", "on", "ignoring", "group_left", "group_right") and nxt[1] == "(":
            while i < len(tokens) and tokens[i][1] != ")":  # a label list
                i += 1
        elif kind == "ident" and text not in _KEYWORDS | _AGGREGATORS and nxt[1] != "(":
            matchers = []
            if nxt[0] == "brace":
                matchers = [(m.group(1), m.group(2), m.group(3)) for m in _MATCHER.finditer(nxt[1][1:-1])]
                i += 1
            out.append((text, matchers))
        i += 1
    return out


def parse_exposition(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """Metric names a /metrics page exposes (histograms with their suffixes), and each name's `what` values."""
    names: set[str] = set()
    whats: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names.add(name)
            if kind == "histogram":
                names |= {name + s for s in ("_bucket", "_sum", "_count")}
        elif line and not line.startswith("#"):
            name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
            names.add(name)
            if (m := re.search(r'\bwhat="([^"]*)"', line)) is not None:
                whats.setdefault(name, set()).add(m.group(1))
    return names, whats


def metric_problems(expr: str, names: set[str], whats: dict[str, set[str]]) -> list[str]:
    problems = []
    found = selectors(expr)
    if not found:
        problems.append(f"no series in {expr!r}")
    for name, matchers in found:
        if name in SYNTHETIC:
            continue
        if name not in names:
            problems.append(f"{name}: no such metric")
            continue
        for label, op, value in matchers:
            if label != "what" or op not in ("=", "=~"):
                continue
            have = whats.get(name, set())
            if op == "=" and value not in have:
                problems.append(f'{name}{{what="{value}"}}: no such series (has {sorted(have)})')
            if op == "=~" and re.fullmatch(r"[\w|]+", value):  # a list of names: each one
                problems += [f'{name}{{what="{w}"}}: no such series' for w in value.split("|") if w not in have]
            elif op == "=~" and not any(re.fullmatch(value, w) for w in have):
                problems.append(f'{name}{{what=~"{value}"}}: matches no series')
    return problems


@pytest.fixture(scope="module")
def exposition(hub: Hub, tmp_path_factory) -> tuple[set[str], dict[str, set[str]]]:
    """/metrics of a real hub and spoke after some traffic: an upload, and a cold read by a named job."""
    repo = unique_name("deploy")
    hub.plane().create_repo(repo)
    hub.plane().put_object(repo, "main", "a.bin", io.BytesIO(bytes(range(256)) * 4096))
    with start_spoke(hub.url, tmp_path_factory.mktemp("deploy-spoke") / "cache", "256MiB", token=hub.token) as spoke:
        with spoke.client(headers={"X-Fabric-Job": "deploy-test"}) as c:
            r = c.get(f"/api/v1/repos/{repo}/refs/main/objects", params={"path": "a.bin"})
            assert r.status_code == 200, r.text
        pages = [httpx.get(url + "/metrics", timeout=30).text for url in (hub.url, spoke.url)]
    names: set[str] = set()
    whats: dict[str, set[str]] = {}
    for page in pages:
        n, w = parse_exposition(page)
        names |= n
        for k, v in w.items():
            whats.setdefault(k, set()).update(v)
    assert "fabric_spoke_job_demand_bytes_total" in names and "upstream_bytes_received_demand" in whats["fabric_spoke"]
    return names, whats


def test_alert_and_dashboard_metrics_exist(exposition) -> None:
    names, whats = exposition
    exprs = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()] + [("dashboard", e) for e in dashboard_exprs()]
    problems = [f"{where}: {p}" for where, expr in exprs for p in metric_problems(expr, names, whats)]
    assert not problems, "\n".join(problems)
    # and the check can fail
    assert metric_problems("rate(fabric_spoke_cache_hits_total[5m])", names, whats)
    assert metric_problems('fabric_spoke{what="cache_hits"} > 0', names, whats)
    assert metric_problems('sum by (what) (fabric_spoke{what=~"upstream_bytes_nowhere_.+"})', names, whats)
    assert metric_problems('fabric_spoke{what=~"cache_hit_bytes|cache_hits"}', names, whats)
    assert metric_problems('histogram_quantile(0.99, sum by (le) (rate(fabric_http_request_secs_bucket[5m])))', names, whats)
    assert not metric_problems('sum by (job, le) (rate(fabric_http_request_seconds_bucket{route!="/x"}[5m])) and on(job) up == 1', names, whats)


# Prometheus relabelling, enough for the keep/replace/labeldrop rules of prometheus-scrape.yaml.
def relabel(labels: dict[str, str], rules: list[dict]) -> dict[str, str] | None:
    labels = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        regex = rule.get("regex", "(.*)")
        if action == "labeldrop":
            labels = {k: v for k, v in labels.items() if not re.fullmatch(regex, k)}
            continue
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule.get("source_labels", []))
        m = re.fullmatch(regex, value)
        if action == "keep":
            if not m:
                return None
        elif action == "drop":
            if m:
                return None
        elif action == "replace":
            if m:
                labels[rule["target_label"]] = m.expand(rule.get("replacement", "$1").replace("$", "\\"))
        else:
            raise AssertionError(f"relabel action {action} is not simulated here")
    return labels


def scrape_targets(jobs: list[dict], objs: list[dict]) -> dict[str, set[tuple[str, str]]]:
    """job -> {(workload, port name)} kept by its relabelling, for the pods of ``objs``."""
    out: dict[str, set[tuple[str, str]]] = {}
    for job in jobs:
        (sd,) = job["kubernetes_sd_configs"]
        assert sd["role"] == "pod"
        for o in objs:
            spec = pod_spec(o)
            if spec is None or o["kind"] == "Pod":
                continue
            labels = {"__meta_kubernetes_namespace": "fabric", "__meta_kubernetes_pod_name": "p", "__meta_kubernetes_pod_node_name": "n"}
            labels |= {"__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", k): v for k, v in o["spec"]["template"]["metadata"]["labels"].items()}
            for c in containers(spec):
                for port in c.get("ports", []):
                    kept = relabel(labels | {"__meta_kubernetes_pod_container_port_name": port.get("name", "")}, job["relabel_configs"])
                    if kept is not None:
                        assert {"namespace", "pod", "node"} <= set(kept)
                        out.setdefault(job["job_name"], set()).add((o["metadata"]["name"], port["name"]))
    return out


@kubectl
def test_scrape_jobs_find_the_hub_and_spoke_pods() -> None:
    jobs = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())["scrape_configs"]
    objs = render("default")
    targets = scrape_targets(jobs, objs)
    assert targets == {"fabric-hub": {("fabric-hub", "http")}, "fabric-spoke": {("fabric-spoke", "http")}}
    # the jobs' ports are the ones /metrics is served on
    assert {p["containerPort"] for p in container(find(objs, "StatefulSet", "fabric-hub")["spec"]["template"]["spec"], "hub")["ports"] if p["name"] == "http"} == {8600}
    assert {p["containerPort"] for p in container(find(objs, "DaemonSet", "fabric-spoke")["spec"]["template"]["spec"], "spoke")["ports"] if p["name"] == "http"} == {8700}
    # per-job series get fabric_job, not exported_job
    spoke_job = next(j for j in jobs if j["job_name"] == "fabric-spoke")
    assert relabel({"exported_job": "run-1", "what": "x"}, spoke_job["metric_relabel_configs"]) == {"fabric_job": "run-1", "what": "x"}
    # and a relabelling that finds nothing is noticed
    for o in objs:
        if o["kind"] in WORKLOADS:
            o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] = "renamed"
    assert scrape_targets(jobs, objs) == {}


@kubectl
def test_podmonitors_match_the_pods() -> None:
    objs = render("default")
    monitors = list(yaml.safe_load_all((MONITORING / "prometheus-operator" / "podmonitors.yaml").read_text()))
    assert {m["metadata"]["name"] for m in monitors} == {"fabric-hub", "fabric-spoke"}
    for m in monitors:
        sel = m["spec"]["selector"]["matchLabels"]
        pods = [o for o in objs if o["kind"] in WORKLOADS and sel.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
        assert [p["metadata"]["name"] for p in pods] == [m["metadata"]["name"]]
        ports = {p["name"] for c in containers(pod_spec(pods[0])) for p in c.get("ports", [])}
        for ep in m["spec"]["podMetricsEndpoints"]:
            assert ep["port"] in ports and ep["path"] == "/metrics"
            assert {"targetLabel": "job", "replacement": m["metadata"]["name"]} in ep["relabelings"]


@promtool
def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    # Debian's promtool is built without Kubernetes discovery: check the rest with static targets.
    config = yaml.safe_load((MONITORING / "prometheus-scrape.yaml").read_text())
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")
        job["static_configs"] = [{"targets": ["127.0.0.1:8600"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# -- systemd -------------------------------------------------------------------------------------------------------------------


def unit_items(path: Path) -> list[tuple[str, str]]:
    """Key and value of each assignment of a unit file, in order (keys may repeat); keys
    outside [Service] are named ``Section.Key``."""
    out, section = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        key = key.strip() if section == "Service" else f"{section}.{key.strip()}"
        out.append((key, value.strip()))
    return out


def unit(path: Path) -> dict[str, list[str]]:
    d: dict[str, list[str]] = {}
    for k, v in unit_items(path):
        d.setdefault(k, []).append(v)
    return d


SANDBOX = {"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "ReadWritePaths", "PrivateMounts", "ProtectKernelTunables", "RootDirectory", "TemporaryFileSystem"}


def test_systemd_units() -> None:
    units = {p.name: unit(p) for p in SYSTEMD.glob("*.service")}
    assert set(units) == {"fabric-hub.service", "fabric-spoke.service", "fabric-mount@.service"}
    for name, u in units.items():
        assert u["Unit.Description"] and u["Install.WantedBy"] == ["multi-user.target"], name
        assert u["Restart"] == ["on-failure"] and u["LimitNOFILE"] and u["NoNewPrivileges"] == ["yes"], name
        assert u["EnvironmentFile"], name
        for key, values in u.items():
            if key.startswith("Exec"):
                for v in values:  # tokens come from the EnvironmentFile, never the command line
                    assert "--token" not in v and "TOKEN" not in v, f"{name} {key}: {v}"
    for name in ("fabric-hub.service", "fabric-spoke.service"):
        u = units[name]
        assert u["ProtectSystem"] == ["strict"] and u["ReadWritePaths"] and u["PrivateTmp"] == ["yes"], name
        (start,) = u["ExecStart"]
        words = shlex.split(start)
        data = words[words.index("--data") + 1] if "--data" in words else words[words.index("--cache") + 1]
        assert data in u["ReadWritePaths"][0].split(), f"{name}: {data} is not writable under ProtectSystem=strict"
    mount = units["fabric-mount@.service"]
    assert "mount --foreground" in mount["ExecStart"][0] and "fabric umount" in mount["ExecStop"][0] and mount["KillMode"]
    # the FUSE mount must land in the host's mount namespace
    assert not SANDBOX & set(mount), sorted(SANDBOX & set(mount))
    # FABRIC_TOKEN in the environment files is what the commands read
    assert option(["spoke"], "--token").envvar == option(["mount"], "--token").envvar == "FABRIC_TOKEN"
    for env in ("fabric-spoke.env", "fabric-mount.env"):
        assert re.search(r"^FABRIC_TOKEN=", (SYSTEMD / env).read_text(), re.M), env
    assert (SYSTEMD / "fabric-hub.env").is_file()


def test_systemd_flags_exist() -> None:
    lines = list(systemd_command_lines())
    assert sorted(argv[0] for _, argv in lines) == ["hub", "mount", "spoke", "umount"]
    problems = [f"{where}: {p}" for where, argv in lines for p in cli_problems(list(argv))]
    assert not problems, "\n".join(problems)


@requires(lambda: None if shutil.which("systemd-analyze") else "systemd-analyze is not installed (package systemd)")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    fabric = shutil.which("fabric", path=str(Path(sys.executable).parent)) or shutil.which("fabric")
    assert fabric, "the fabric command is not installed next to this Python"
    paths = []
    for src in SYSTEMD.glob("*.service"):
        text = src.read_text().replace("/usr/local/bin/fabric", fabric)
        if not Path("/usr/bin/fusermount3").exists():
            text = text.replace("/usr/bin/fusermount3", shutil.which("true") or "/bin/true")
        dst = tmp_path / src.name.replace("@.service", "@test.service")
        dst.write_text(text)
        paths.append(str(dst))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *paths], capture_output=True, text=True, timeout=60)
    output = (done.stdout + done.stderr).strip()
    # unknown keys and bad values are only warnings: any output is a failure
    assert done.returncode == 0 and not output, output
    bad = tmp_path / "fabric-bad.service"
    bad.write_text(Path(paths[0]).read_text().replace("Restart=on-failure", "Restart=on-failur"))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(bad)], capture_output=True, text=True, timeout=60)
    assert (done.stdout + done.stderr).strip()


# -- the image -----------------------------------------------------------------------------------------------------------------


def test_dockerfile() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON=python:3\.11-slim", text, re.M)
    assert re.search(r"apt-get install .*\bfuse3\b", text) and '"/src[csi]"' in text
    assert re.search(r'^ENTRYPOINT \["fabric"\]', text, re.M) and re.search(r"^USER 10001", text, re.M)
    # the build context is the repository root: nothing pip needs may be ignored
    ignored = [p for p in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    for needed in ("pyproject.toml", "README.md", "fabric", "hub", "spoke", "fuse", "csi", "testbed", "csi/csi.proto"):
        assert (ROOT / needed).exists(), needed
        hits = [p for p in ignored if fnmatch.fnmatch(needed, p) or needed.startswith(p.rstrip("/") + "/")]
        assert not hits, f"{needed} is excluded from the build context by {hits}"


def test_docs_name_what_exists() -> None:
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "kubectl apply -k deploy/kubernetes/overlays/default" in doc
    for overlay in OVERLAYS:
        assert f"overlays/{overlay}" in doc, overlay
    for comp in (K8S / "components").iterdir():
        assert f"components/{comp.name}" in doc, comp.name
    for opt in ("ro", "durability=", "cache-size=", "commit-interval=", "commit-on-unmount"):
        assert f"`{opt}" in doc, opt
