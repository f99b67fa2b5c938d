"""The deployment files, checked offline (issue 18): every kustomize overlay
and the Helm chart render and pass strict Kubernetes schema validation;
selectors match their pod templates; probes and Services point at ports the
containers open, and those ports and every flag in the containers' args are
the binaries' own (parsed from --help); hadolint passes on the Dockerfiles,
yamllint on the YAML, and the compose file follows the compose spec."""
import base64
import glob
import json
import os
import re
import subprocess

import pytest
import yaml

ROOT = os.environ.get("BALLAST_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("BALLAST_BIN_DIR", os.path.join(ROOT, "build", "bin"))
DEPLOY = os.path.join(ROOT, "deploy")
CHART = os.path.join(DEPLOY, "helm", "ballast")
# What each container runs: its args go to this binary (None: not ours, the
# bundled PostgreSQL's).
ENTRYPOINTS = {"ballastd": "ballastd", "ballast-worker": "ballast-worker", "postgres": None}


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
    "helm bundled postgresql + migration": lambda: helm(
        "postgresql.enabled=true", "store.migrateFromSqlite=true"),
    "helm external postgresql": lambda: helm("store.url=postgresql://ballast@db:5432/ballast"),
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
            if binary is None:
                continue
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


def ballastd_env(docs):
    """The env of the ballastd container, by name."""
    (coordinator,) = [d for d in docs if d["kind"] == "StatefulSet" and
                      d["metadata"]["name"] == "ballast-coordinator"]
    (container,) = coordinator["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}, coordinator["spec"]["template"]["spec"]


def test_helm_gives_ballastd_a_postgresql_url_from_a_secret_never_its_args():
    # ballastd reads BALLAST_STORE as --store.
    assert "BALLAST_STORE" in run(os.path.join(BIN, "ballastd"), "--help")
    env, pod = ballastd_env([d for d in yaml.safe_load_all(helm()) if d])
    assert "BALLAST_STORE" not in env and "initContainers" not in pod

    url = "postgresql://ballast:hunter2@db:5432/ballast"
    text = helm(f"store.url={url}")
    docs = [d for d in yaml.safe_load_all(text) if d]
    env, pod = ballastd_env(docs)
    ref = env["BALLAST_STORE"]["valueFrom"]["secretKeyRef"]
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"]]
    assert base64.b64decode(secret["data"][ref["key"]]).decode() == url
    assert "hunter2" not in json.dumps(pod)

    env, _ = ballastd_env([d for d in yaml.safe_load_all(
        helm("store.existingSecret=my-db", "store.existingSecretKey=uri")) if d])
    assert env["BALLAST_STORE"]["valueFrom"]["secretKeyRef"] == {"name": "my-db", "key": "uri"}


def test_helm_bundles_a_postgresql_that_ballastd_reaches_and_migrates_into():
    docs = [d for d in yaml.safe_load_all(RENDERINGS["helm bundled postgresql + migration"]()) if d]
    env, pod = ballastd_env(docs)
    (server,) = [d for d in docs if d["kind"] == "StatefulSet" and
                 d["metadata"]["name"] == "ballast-postgresql"]
    (service,) = [d for d in docs if d["kind"] == "Service" and
                  d["metadata"]["name"] == "ballast-postgresql"]
    assert matches(service["spec"]["selector"], server["spec"]["template"]["metadata"]["labels"])
    assert service["spec"]["ports"][0]["port"] == 5432
    url = env["BALLAST_STORE"]["value"]
    assert url.startswith("postgresql://ballast@ballast-postgresql:5432/ballast"), url
    # ballastd's password is the one the server was made with.
    (postgres,) = server["spec"]["template"]["spec"]["containers"]
    server_env = {e["name"]: e for e in postgres["env"]}
    assert (env["PGPASSWORD"]["valueFrom"] ==
            server_env["POSTGRES_PASSWORD"]["valueFrom"])
    assert server_env["POSTGRES_USER"]["value"] == "ballast"
    assert server_env["POSTGRES_DB"]["value"] == "ballast"
    # The copy from SQLite runs first, on the store's volume, into that URL.
    (init,) = pod["initContainers"]
    script = init["command"][-1]
    assert "ballast migrate-store sqlite:/var/lib/ballast/ballastd.db \"$BALLAST_STORE\"" in script
    assert "mv ballastd.db ballastd.db.migrated" in script
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == {"store": "/var/lib/ballast"}
    assert {e["name"] for e in init["env"]} == {"BALLAST_STORE", "PGPASSWORD"}

    for values, message in [
            (["postgresql.enabled=true", "store.url=postgresql://db/x"], "pick one"),
            (["store.migrateFromSqlite=true"], "store.migrateFromSqlite copies into PostgreSQL")]:
        args = ["helm", "template", "b", CHART]
        for v in values:
            args += ["--set", v]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and message in r.stderr, r.stderr


def test_the_compose_postgres_profile_adds_a_server_the_coordinator_can_use():
    compose = ["podman-compose", "-f", os.path.join(DEPLOY, "compose", "compose.yaml")]
    plain = yaml.safe_load(run(*compose, "config"))
    assert "postgres" not in plain["services"]
    env = {"BALLAST_STORE": "postgresql://ballast@127.0.0.1:5433/ballast",
           "BALLAST_PG_PASSWORD": "pw", "BALLAST_PG_PORT": "5433"}
    profiled = yaml.safe_load(run(*compose, "--profile", "postgres", "config",
                                  env={**os.environ, **env}))
    server = profiled["services"]["postgres"]
    assert server["environment"]["POSTGRES_PASSWORD"] == "pw"
    assert "5433" in server["command"]
    coordinator = profiled["services"]["coordinator"]["environment"]
    assert coordinator["BALLAST_STORE"] == env["BALLAST_STORE"]
    assert coordinator["PGPASSWORD"] == "pw"


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
