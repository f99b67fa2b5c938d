"""The deployment files, checked offline (issue 18): every kustomize overlay
and the Helm chart render and pass strict Kubernetes schema validation;
selectors match their pod templates; probes and Services point at ports the
containers open, and those ports and every flag in the containers' args are
the binaries' own (parsed from --help); hadolint passes on the Dockerfiles,
yamllint on the YAML, and the compose file follows the compose spec."""
import glob
import os
import re
import subprocess

import pytest
import yaml

ROOT = os.environ.get("BALLAST_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("BALLAST_BIN_DIR", os.path.join(ROOT, "build", "bin"))
DEPLOY = os.path.join(ROOT, "deploy")
CHART = os.path.join(DEPLOY, "helm", "ballast")
# What each container runs: its args go to this binary.
ENTRYPOINTS = {"ballastd": "ballastd", "ballast-worker": "ballast-worker"}


def run(*args, **kwargs):
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)
    assert r.returncode == 0, f"{' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def kustomize(path):
    return run("kubectl", "kustomize", path)


def helm(*values):
    args = ["helm", "template", "ballast", CHART, "--namespace", "ballast"]
    for v in values:
        args += ["-f", v] if v.endswith(".yaml") else ["--set", v]
    return run(*args)


RENDERINGS = {
    "kustomize cpu-dev": lambda: kustomize(os.path.join(DEPLOY, "k8s", "overlays", "cpu-dev")),
    "kustomize gpu": lambda: kustomize(os.path.join(DEPLOY, "k8s", "overlays", "gpu")),
    "helm defaults": lambda: helm(),
    "helm cpu-dev": lambda: helm(os.path.join(CHART, "values-cpu-dev.yaml")),
    "helm existing claim + servicemonitor": lambda: helm(
        "sharedStorage.type=existing", "sharedStorage.claimName=nfs-models",
        "serviceMonitor.enabled=true", "existingSecret=my-token"),
}


@pytest.fixture(scope="module", params=sorted(RENDERINGS))
def rendered(request, tmp_path_factory):
    text = RENDERINGS[request.param]()
    path = tmp_path_factory.mktemp("render") / "all.yaml"
    path.write_text(text)
    return request.param, str(path), [d for d in yaml.safe_load_all(text) if d]


def flags_of(binary):
    """The long flags `binary --help` lists."""
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", run(os.path.join(BIN, binary), "--help")))


def pods(docs):
    """(workload, pod spec, pod labels) of each workload."""
    for d in docs:
        if d["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
            template = d["spec"]["template"]
            yield d, template["spec"], template["metadata"].get("labels", {})


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def test_it_passes_strict_schema_validation(rendered):
    name, path, docs = rendered
    out = run("kubernetes-validate", "--strict", "--kubernetes-version", "1.32.0", path)
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "DaemonSet", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    assert "Secret" in kinds or "existing" in name or "gpu" in name, kinds
    # Only the ServiceMonitor, a CRD, has no schema to check against.
    unvalidated = re.findall(r"Couldn't find schema for kind (\w+)", out)
    assert set(unvalidated) <= {"ServiceMonitor"}, out


def test_selectors_match_their_pods_and_services_find_them(rendered):
    _, _, docs = rendered
    workloads = list(pods(docs))
    assert workloads
    for workload, _, labels in workloads:
        assert matches(workload["spec"]["selector"]["matchLabels"], labels), workload["metadata"]
    for d in docs:
        if d["kind"] == "Service":
            assert any(matches(d["spec"]["selector"], labels) for _, _, labels in workloads), d
        if d["kind"] == "PodDisruptionBudget":
            assert any(matches(d["spec"]["selector"]["matchLabels"], labels)
                       for _, _, labels in workloads), d
        if d["kind"] == "ServiceMonitor":
            services = [s for s in docs if s["kind"] == "Service" and
                        matches(d["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
            assert services, d
            ports = {p["name"] for p in services[0]["spec"]["ports"]}
            assert {e["port"] for e in d["spec"]["endpoints"]} <= ports


def test_args_probes_and_ports_agree_with_the_binaries(rendered):
    _, _, docs = rendered
    for workload, spec, _ in pods(docs):
        for c in spec["containers"]:
            binary = ENTRYPOINTS[c["name"]]
            args = c.get("args", [])
            unknown = {a for a in args if a.startswith("--")} - flags_of(binary)
            assert not unknown, f"{c['name']}: flags {unknown} are not in {binary} --help"
            values = dict(zip(args[::2], args[1::2]))
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            if binary == "ballastd":
                assert values["--listen"] == f"0.0.0.0:{ports['grpc']}"
                assert values["--http"] == f"0.0.0.0:{ports['http']}"
                for probe in ("startupProbe", "livenessProbe"):
                    assert c[probe]["grpc"]["port"] == ports["grpc"]
                assert c["readinessProbe"]["httpGet"] == {"path": "/healthz",
                                                          "port": ports["http"]}
                mounts = {m["mountPath"] for m in c["volumeMounts"]}
                assert values["--state-dir"] in mounts
                assert values["--output-root"].startswith("/srv/ballast/")
            else:
                assert spec["hostNetwork"] is True
                assert values["--host"] == "$(NODE_IP)"
                assert "NODE_IP" in {e["name"] for e in c["env"]}
                assert values["--shared-dir"] in {m["mountPath"] for m in c["volumeMounts"]}
                assert values["--http"] == f"0.0.0.0:{ports['http']}"
                assert c["readinessProbe"]["httpGet"] == {"path": "/healthz",
                                                          "port": ports["http"]}
                gpus = c["resources"].get("limits", {}).get("nvidia.com/gpu")
                # A worker offers GPUs or CPU slots, never neither.
                assert ("--cpu-slots" in values) != (gpus is not None), (values, c["resources"])
            for e in c.get("env", []):
                if e["name"] == "BALLAST_TOKEN":
                    assert e["valueFrom"]["secretKeyRef"]["key"] == "BALLAST_TOKEN"
        for d in docs:
            if d["kind"] == "Service" and matches(d["spec"]["selector"],
                                                  workload["spec"]["template"]["metadata"]["labels"]):
                names = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
                assert {p["targetPort"] for p in d["spec"]["ports"]} <= names


def test_both_overlays_share_the_base_and_differ_where_they_should():
    cpu = [d for d in yaml.safe_load_all(RENDERINGS["kustomize cpu-dev"]()) if d]
    gpu = [d for d in yaml.safe_load_all(RENDERINGS["kustomize gpu"]()) if d]
    cpu_worker = next(d for d in cpu if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    gpu_worker = next(d for d in gpu if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert gpu_worker["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "nodeSelector" not in cpu_worker
    shared = {v["name"]: v for v in cpu_worker["volumes"]}["shared"]
    assert shared == {"name": "shared", "hostPath": {"path": "/srv/ballast",
                                                      "type": "DirectoryOrCreate"}}
    assert not any(d["kind"] == "PersistentVolumeClaim" for d in cpu)
    assert any(d["kind"] == "PersistentVolumeClaim" and
               d["spec"]["accessModes"] == ["ReadWriteMany"] for d in gpu)
    # The gpu overlay expects the operator's Secret; cpu-dev generates one.
    assert not any(d["kind"] == "Secret" for d in gpu)


def test_the_servicemonitor_component_renders(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # kustomize takes only relative paths.
        "resources": [os.path.relpath(os.path.join(DEPLOY, "k8s", "overlays", "gpu"), overlay)],
        "components": [os.path.relpath(os.path.join(DEPLOY, "k8s", "components", "servicemonitor"),
                                       overlay)]}))
    docs = [d for d in yaml.safe_load_all(kustomize(str(overlay))) if d]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_helm_keeps_a_generated_token_and_refuses_a_bad_storage_type():
    docs = [d for d in yaml.safe_load_all(helm()) if d]
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert len(secret["data"]["BALLAST_TOKEN"]) >= 48
    r = subprocess.run(["helm", "template", "b", CHART, "--set", "sharedStorage.type=nfs"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "sharedStorage.type must be pvc, existing or hostPath" in r.stderr
    run("helm", "lint", "--strict", CHART)


def test_hadolint_passes_on_the_dockerfiles():
    files = sorted(glob.glob(os.path.join(DEPLOY, "images", "*.Dockerfile")))
    assert len(files) == 2
    run("hadolint", *files)


def test_yamllint_passes_and_the_compose_file_follows_the_spec():
    # The chart's templates are Go templates, not YAML until rendered.
    files = [f for f in glob.glob(os.path.join(DEPLOY, "**", "*.yaml"), recursive=True)
             if "/templates/" not in f]
    files += glob.glob(os.path.join(ROOT, "examples", "*.yaml"))
    run("yamllint", "--strict", "-c", os.path.join(ROOT, ".yamllint.yaml"), *files)
    run("check-jsonschema", "--builtin-schema", "vendor.compose-spec",
        os.path.join(DEPLOY, "compose", "compose.yaml"))
