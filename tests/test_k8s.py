"""`hwbench k8s`: the printed PyTorchJob manifest, parsed back as kubectl would read it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

import hwbench
import hwbench.cli
from hwbench import k8s
from hwbench.cli import run_command
from hwbench.commands import k8s as k8s_command
from hwbench.errors import UsageError

BASE = ["--image", "registry.example.com/hwbench:0.1"]
# The tiny model with a global batch that every data-parallel degree used here divides.
TINY = ["--model", "tiny", "--micro-batch-size", "1", "--global-batch-size", "48"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No NCCL_/HCCL_/ASCEND_ variable of the machine running the tests leaks into the manifests."""
    import os

    for key in list(os.environ):
        if key.startswith(("NCCL_", "TORCH_NCCL_", "HCCL_", "ASCEND_")):
            monkeypatch.delenv(key)


def manifest(capsys, *argv: str) -> dict:
    assert run_command("k8s", [*BASE, *argv]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ")
    return yaml.safe_load(out)


def pod_words(spec: dict) -> list[str]:
    """The words of the container's `sh -c` script as the shell splits them ($VARs left unexpanded)."""
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["/bin/sh", "-c"]
    return shlex.split(container["command"][2])


def container(spec: dict) -> dict:
    return spec["template"]["spec"]["containers"][0]


def test_two_nodes_cuda_manifest(capsys):
    m = manifest(capsys, "--nnodes", "2", "--nproc-per-node", "8", "--device", "cuda", "--model", "1.3b",
                 "--tp", "2", "--pp", "2")
    assert m["apiVersion"] == "kubeflow.org/v1" and m["kind"] == "PyTorchJob"
    assert m["metadata"]["name"] == "hwbench-1-3b-2x8"
    assert m["metadata"]["labels"]["app.kubernetes.io/name"] == "hwbench"
    assert m["metadata"]["annotations"]["hwbench/version"] == hwbench.__version__
    replicas = m["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1
    for spec in replicas.values():
        assert spec["restartPolicy"] == "Never"
        c = container(spec)
        assert c["name"] == "pytorch"
        assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
        assert c["resources"]["requests"] == {"nvidia.com/gpu": "8"}
        words = pod_words(spec)
        assert words[:3] == ["exec", "hwbench", "run"]
        assert words[3:7] == ["--device", "cuda", "--model", "1.3b"]  # the run options, as RunOptions.to_argv()
        assert words[words.index("--tp") + 1] == "2" and "--pp" in words
        launch = " ".join(words[words.index("--nnodes"):])
        assert "--nnodes 2 --nproc-per-node 8 --node-rank $RANK --master-addr $MASTER_ADDR " \
               "--master-port $MASTER_PORT" in launch
        assert '--node-rank "$RANK"' in c["command"][2]  # quoted for the shell, expanded in the pod
        assert words[words.index("--out") + 1] == "/results/runs"
        volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
        mounts = {v["mountPath"]: v["name"] for v in c["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
        assert "emptyDir" in volumes[mounts["/results"]]
    assert m["spec"]["runPolicy"] == {"cleanPodPolicy": "None", "backoffLimit": 0}


def test_single_node_has_no_worker_and_default_device_is_cuda(capsys):
    m = manifest(capsys, "--nnodes", "1", "--nproc-per-node", "4", *TINY)
    replicas = m["spec"]["pytorchReplicaSpecs"]
    assert list(replicas) == ["Master"] and replicas["Master"]["replicas"] == 1
    words = pod_words(replicas["Master"])
    assert words[words.index("--device") + 1] == "cuda"
    assert container(replicas["Master"])["resources"]["limits"] == {"nvidia.com/gpu": "4"}


def test_the_default_device_is_said_not_silent(capsys):
    assert run_command("k8s", [*BASE, "--nnodes", "1", "--nproc-per-node", "4", *TINY]) == 0
    assert ("hwbench: note: no --device given: the pods run --device cuda and request nvidia.com/gpu; give --device "
            "cuda|rocm|npu|hpu|cpu for another kind") in capsys.readouterr().err
    assert run_command("k8s", [*BASE, "--nnodes", "1", "--nproc-per-node", "4", *TINY, "--device", "cuda"]) == 0
    assert "no --device given" not in capsys.readouterr().err


def test_four_nodes_three_workers_with_options(capsys):
    m = manifest(capsys, "--nnodes", "4", "--nproc-per-node", "2", *TINY, "--name", "my-bench",
                 "--namespace", "bench", "--restart-policy", "OnFailure", "--backoff-limit", "2",
                 "--active-deadline", "3600", "--results-claim", "bench-results", "--shm-size", "8Gi",
                 "--master-port", "29500", "--cpu", "16", "--memory", "64Gi", "--steps", "7")
    assert m["metadata"]["name"] == "my-bench" and m["metadata"]["namespace"] == "bench"
    assert m["spec"]["runPolicy"] == {"cleanPodPolicy": "None", "backoffLimit": 2, "activeDeadlineSeconds": 3600}
    worker = m["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3 and worker["restartPolicy"] == "OnFailure"
    c = container(worker)
    assert c["resources"]["requests"] == {"nvidia.com/gpu": "2", "cpu": "16", "memory": "64Gi"}
    assert c["ports"][0]["containerPort"] == 29500
    volumes = {v["name"]: v for v in worker["template"]["spec"]["volumes"]}
    assert volumes["results"] == {"name": "results", "persistentVolumeClaim": {"claimName": "bench-results"}}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "8Gi"
    words = pod_words(worker)
    assert words[words.index("--steps") + 1] == "7"


def test_npu_requests_ascend_and_passes_hccl_and_ascend_env(capsys, monkeypatch):
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "1200")
    monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", "3")
    monkeypatch.setenv("ASCEND_VISIBLE_DEVICES", "0,1")  # the device plugin's, never copied
    m = manifest(capsys, "--nnodes", "2", "--nproc-per-node", "8", "--device", "npu", *TINY)
    c = container(m["spec"]["pytorchReplicaSpecs"]["Master"])
    assert c["resources"]["limits"] == {"huawei.com/Ascend910": "8"}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"ASCEND_GLOBAL_LOG_LEVEL": "3", "HCCL_CONNECT_TIMEOUT": "1200"}
    assert set(m["metadata"]["annotations"]["hwbench/env-passed"].split(",")) == set(env)


def test_cpu_requests_no_accelerator(capsys):
    m = manifest(capsys, "--nnodes", "2", "--nproc-per-node", "2", "--device", "cpu", *TINY)
    for spec in m["spec"]["pytorchReplicaSpecs"].values():
        resources = container(spec).get("resources", {})
        assert not any("gpu" in k or "Ascend" in k for part in resources.values() for k in part)


def test_nccl_env_passed_through_and_env_option(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("ASCEND_GLOBAL_LOG_LEVEL", "3")  # npu only
    monkeypatch.setenv("OTHER_VARIABLE", "x")
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "900")
    m = manifest(capsys, "--nnodes", "2", "--nproc-per-node", "8", *TINY,
                 "--env", "NCCL_DEBUG=INFO", "--env", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1")
    for spec in m["spec"]["pytorchReplicaSpecs"].values():
        env = {e["name"]: e["value"] for e in container(spec)["env"]}
        assert env == {"NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                       "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "900"}


def test_user_out_kept_and_warned_when_outside_results(capsys):
    assert run_command("k8s", [*BASE, "--nnodes", "1", "--nproc-per-node", "1", *TINY, "--out", "/tmp/x"]) == 0
    captured = capsys.readouterr()
    words = pod_words(yaml.safe_load(captured.out)["spec"]["pytorchReplicaSpecs"]["Master"])
    assert words.count("--out") == 1 and words[words.index("--out") + 1] == "/tmp/x"
    assert "--out /tmp/x is outside the results volume /results" in captured.err


def test_run_args_with_spaces_are_quoted(capsys):
    m = manifest(capsys, "--nnodes", "1", "--nproc-per-node", "1", *TINY,
                 "--data", "/data/my corpus_text_document")
    words = pod_words(m["spec"]["pytorchReplicaSpecs"]["Master"])
    assert words[words.index("--data") + 1] == "/data/my corpus_text_document"


def test_hold_keeps_pod_alive_and_keeps_exit_status(capsys):
    m = manifest(capsys, "--nnodes", "1", "--nproc-per-node", "1", *TINY, "--hold", "600")
    script = container(m["spec"]["pytorchReplicaSpecs"]["Master"])["command"][2]
    assert not script.startswith("exec ") and "sleep 600; exit $rc" in script


def test_build_manifest_is_pure_and_render_has_kubectl_header():
    job = k8s_command.job_from_argv([*BASE, "--nnodes", "3", "--nproc-per-node", "2", *TINY], environ={})
    assert isinstance(job, k8s.K8sJob) and job.device == "cuda" and job.name == "hwbench-tiny-3x2"
    assert k8s.build_manifest(job) == k8s.build_manifest(job)
    text = k8s.render(k8s.build_manifest(job))
    assert "# " in text.splitlines()[0]
    for line in ("kubectl create -f job.yaml", "kubectl get pytorchjobs", "kubectl logs -f hwbench-tiny-3x2-master-0"):
        assert line in text
    assert yaml.safe_load(text)["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


@pytest.mark.parametrize("argv, named", [
    (["--nnodes", "0", "--nproc-per-node", "1"], "--nnodes 0 is not accepted; give an integer >= 1"),
    (["--nnodes", "1", "--nproc-per-node", "x"], "--nproc-per-node 'x'"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--name", "My_Job"], "--name 'My_Job'"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--name", "a" * 60], "--name"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--device", "auto"], "--device 'auto'"),
    (["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", "1"], "--node-rank"),
    (["--nnodes", "2", "--nproc-per-node", "1", "--master-addr=10.0.0.1"], "--master-addr"),
    (["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "h:1"], "--rdzv-endpoint"),
    (["--nnodes", "1", "--nproc-per-node", "4", "--model", "tiny", "--tp", "3"], "--tp 3"),
    (["--nnodes", "1", "--nproc-per-node", "2", "--model", "tiny", "--tp", "4"], "--tp 4"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--restart-policy", "Sometimes"], "--restart-policy 'Sometimes'"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--shm-size", "lots"], "--shm-size 'lots'"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--env", "RANK=3"], "--env 'RANK=3'"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--model", "nope"], "--model 'nope'"),
    (["--nproc-per-node", "1"], "--nnodes"),
    (["--nnodes", "2", "--nproc-per-node", "1", "--name", "2node-test"], "--name '2node-test'"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--api", "jobset"], "--api 'jobset'"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--api", "trainjob", "--backoff-limit", "2"], "--backoff-limit"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--api", "trainjob", "--env", "PET_NODE_RANK=1"], "PET_NODE_RANK"),
    (["--nnodes", "1", "--nproc-per-node", "1", "--runtime", "torch-distributed"], "--runtime"),
])
def test_bad_input_is_one_line_naming_the_option(argv, named, capsys):
    with pytest.raises(UsageError) as error:
        run_command("k8s", [*BASE, *argv])
    message = str(error.value)
    assert named in message and "\n" not in message
    assert capsys.readouterr().out == ""


def test_through_the_cli(capsys):
    assert hwbench.cli.main(["k8s", *BASE, "--nnodes", "2", "--nproc-per-node", "2", *TINY]) == 0
    m = yaml.safe_load(capsys.readouterr().out)
    assert m["kind"] == "PyTorchJob" and m["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert hwbench.cli.main(["k8s", *BASE, "--nnodes", "0", "--nproc-per-node", "2"]) == 2
    assert "hwbench: error: --nnodes 0 is not accepted" in capsys.readouterr().err


# --- Checked against the real CRDs (tests/data/crds, their README names the source) --------

CRDS = Path(__file__).resolve().parent / "data" / "crds"
CRD_FILES = {"PyTorchJob": "kubeflow.org_pytorchjobs.yaml", "TrainJob": "trainer.kubeflow.org_trainjobs.yaml"}
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class Yaml12Loader(yaml.SafeLoader):
    """PyYAML reading scalars as a YAML 1.2 reader (kubectl's, sigs.k8s.io/yaml) does:
    1e3 is a float, 0o17 and 0x1F are integers (PyYAML, YAML 1.1, reads them as text)."""


Yaml12Loader.yaml_implicit_resolvers = {
    key: list(value) for key, value in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _first in "-+0123456789.":
    Yaml12Loader.yaml_implicit_resolvers.setdefault(_first, []).insert(
        0,
        (
            "tag:yaml.org,2002:yaml12number",
            re.compile(
                r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+|[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?)$"
            ),
        ),
    )


def _yaml12_number(loader, node):
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text, 0)
    return int(text) if re.fullmatch(r"[-+]?[0-9]+", text) else float(text)


Yaml12Loader.add_constructor("tag:yaml.org,2002:yaml12number", _yaml12_number)


def strict(schema):
    """The schema as the API server applies it to a create: unknown fields fail, that is
    additionalProperties false on every object schema that lists its properties and does
    not preserve unknown fields."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    return schema


def crd_problems(manifest: dict) -> list[str]:
    """Every way ``manifest`` breaks its CRD: the openAPIV3Schema (strict), ObjectMeta as the
    API server checks it, and the CRD's x-kubernetes-validations rules on the object."""
    import jsonschema

    crd = yaml.safe_load((CRDS / CRD_FILES[manifest["kind"]]).read_text())
    group = crd["spec"]["group"]
    [version] = [v for v in crd["spec"]["versions"] if f"{group}/{v['name']}" == manifest["apiVersion"]]
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft7Validator(strict(schema))
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]
    meta = manifest["metadata"]
    problems += [
        f"metadata.{key}: unknown" for key in meta if key not in ("name", "namespace", "labels", "annotations")
    ]
    if not DNS_1123_SUBDOMAIN.match(meta["name"]) or len(meta["name"]) > 253:
        problems.append(f"metadata.name {meta['name']!r}: not a DNS-1123 subdomain")
    for key, value in {**meta.get("labels", {}), **meta.get("annotations", {})}.items():
        if not isinstance(value, str):
            problems.append(f"metadata label or annotation {key}: {value!r} is not a string")
    for key, value in meta.get("labels", {}).items():
        if isinstance(value, str) and (len(value) > 63 or not LABEL_VALUE.match(value)):
            problems.append(f"metadata.labels.{key}: {value!r} is not a label value")
    for rule in schema.get("x-kubernetes-validations", []):
        if not _rule_holds(rule["rule"], manifest):
            problems.append(f"x-kubernetes-validations: {rule['message']}")
    return problems


def _rule_holds(rule: str, manifest: dict) -> bool:
    """The CEL rules the CRDs here put on the whole object (a new rule fails loudly)."""
    name = manifest["metadata"]["name"]
    matches = re.fullmatch(r"self\.metadata\.name\.matches\('(.+)'\)", rule)
    if matches:
        return re.search(matches.group(1), name) is not None
    size = re.fullmatch(r"size\(self\.metadata\.name\) <= (\d+)", rule)
    if size:
        return len(name) <= int(size.group(1))
    raise AssertionError(f"a CRD rule this test does not evaluate: {rule}")


DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def webhook_problems(manifest: dict) -> list[str]:
    """The training operator's admission webhook for a PyTorchJob, as its source reads
    (kubeflow/training-operator, pkg/webhooks/pytorch/pytorchjob_webhook.go, commit 06f6008e):
    the name a DNS-1035 label, only Master and Worker replicas, exactly 1 Master, a container
    named `pytorch` with an image in every replica."""
    if manifest["kind"] != "PyTorchJob":
        return []
    name = manifest["metadata"]["name"]
    problems = [] if DNS_1035_LABEL.match(name) and len(name) <= 63 else [f"metadata.name {name!r}: not DNS-1035"]
    for kind, replica in manifest["spec"]["pytorchReplicaSpecs"].items():
        if kind not in ("Master", "Worker"):
            problems.append(f"replica type {kind}")
        if (kind == "Master" and replica.get("replicas") != 1) or replica.get("replicas", 1) < 1:
            problems.append(f"{kind}.replicas {replica.get('replicas')}")
        containers = replica["template"]["spec"]["containers"]
        if not any(c["name"] == "pytorch" for c in containers) or not all(c.get("image") for c in containers):
            problems.append(f"{kind}: no container `pytorch` with an image")
    return problems


def printed(capsys, *argv: str) -> dict:
    """The manifest `hwbench k8s` prints, read as kubectl reads YAML."""
    assert run_command("k8s", [*BASE, *argv]) == 0
    return yaml.load(capsys.readouterr().out, Loader=Yaml12Loader)


LAYOUTS = [
    ["--nnodes", "2", "--nproc-per-node", "8", "--device", "cuda", "--model", "1.3b", "--tp", "2", "--pp", "2"],
    ["--nnodes", "1", "--nproc-per-node", "8", "--device", "npu", "--model", "345m", "--results-claim", "results"],
    [
        "--nnodes",
        "3",
        "--nproc-per-node",
        "2",
        "--device",
        "cpu",
        *TINY,
        "--cpu",
        "500m",
        "--memory",
        "8Gi",
        "--namespace",
        "bench",
        "--hold",
        "600",
    ],
]


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["cuda-2x8", "npu-1x8", "cpu-3x2"])
def test_manifests_fit_the_real_crd(capsys, api, layout):
    extra = ["--active-deadline", "3600"] if api == "pytorchjob" else []
    manifest = printed(capsys, "--api", api, *layout, *extra)
    assert crd_problems(manifest) == [] and webhook_problems(manifest) == []


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_env_values_stay_strings_for_a_yaml_12_reader(capsys, api):
    values = {"HCCL_BUFFSIZE": "1e3", "OCTAL": "0o17", "HEX": "0x1F", "PLAIN": "120", "FLAG": "true", "EMPTY": ""}
    m = printed(
        capsys,
        "--api",
        api,
        "--nnodes",
        "1",
        "--nproc-per-node",
        "1",
        "--namespace",
        "1e3",
        "--results-claim",
        "0x10",
        *[f"--env={k}={v}" for k, v in values.items()],
    )
    env = (
        m["spec"]["trainer"]["env"]
        if api == "trainjob"
        else container(m["spec"]["pytorchReplicaSpecs"]["Master"])["env"]
    )
    assert {e["name"]: e["value"] for e in env} == values
    assert m["metadata"]["namespace"] == "1e3"
    assert crd_problems(m) == []


def test_the_checks_catch_what_the_api_server_refuses(capsys):
    """The validation itself can fail: an unknown field, a number where text belongs, a
    bad TrainJob name (the CRD's own rule)."""
    m = printed(capsys, "--nnodes", "2", "--nproc-per-node", "8", "--device", "cuda", "--model", "1.3b")
    master = container(m["spec"]["pytorchReplicaSpecs"]["Master"])
    master["env"] = [{"name": "HCCL_BUFFSIZE", "value": 1000.0}]
    master["gpus"] = 8
    m["spec"]["runPolicy"]["backoffLimit"] = "0"
    problems = "\n".join(crd_problems(m))
    assert "1000.0 is not of type 'string'" in problems
    assert "'gpus' was unexpected" in problems
    assert "'0' is not of type 'integer'" in problems
    m["metadata"]["name"] = "2node-test"  # passes DNS-1123, as hwbench's check once did
    assert webhook_problems(m) == ["metadata.name '2node-test': not DNS-1035"]
    t = printed(capsys, "--api", "trainjob", "--nnodes", "1", "--nproc-per-node", "1")
    t["metadata"]["name"] = "2node-test"
    assert "metadata.name must match RFC 1035 DNS label format" in "\n".join(crd_problems(t))


def test_counts_are_strings_the_kubernetes_client_accepts(capsys):
    m = printed(capsys, "--nnodes", "1", "--nproc-per-node", "8", "--device", "cuda", "--cpu", "16")
    resources = container(m["spec"]["pytorchReplicaSpecs"]["Master"])["resources"]
    assert resources == {"requests": {"nvidia.com/gpu": "8", "cpu": "16"}, "limits": {"nvidia.com/gpu": "8"}}


def test_trainjob_runs_the_same_hwbench_run_on_every_node(capsys):
    m = printed(
        capsys,
        "--api",
        "trainjob",
        "--nnodes",
        "4",
        "--nproc-per-node",
        "8",
        "--device",
        "cuda",
        "--model",
        "1.3b",
        "--tp",
        "2",
        "--runtime",
        "torch-cuda-12",
    )
    assert m["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and m["kind"] == "TrainJob"
    assert m["spec"]["runtimeRef"] == {"name": "torch-cuda-12"}
    trainer = m["spec"]["trainer"]
    assert trainer["numNodes"] == 4 and trainer["numProcPerNode"] == 8
    assert trainer["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "8"}
    words = shlex.split(trainer["command"][2])
    assert words[:3] == ["exec", "hwbench", "run"] and words[words.index("--model") + 1] == "1.3b"
    for flag, value in (
        ("--nnodes", "4"),
        ("--nproc-per-node", "8"),
        ("--node-rank", "$PET_NODE_RANK"),
        ("--master-addr", "$PET_MASTER_ADDR"),
        ("--master-port", "$PET_MASTER_PORT"),
    ):
        assert words[words.index(flag) + 1] == value
    [override] = m["spec"]["podTemplateOverrides"]
    assert override["targetJobs"] == [{"name": "node"}]
    assert {v["name"] for v in override["spec"]["volumes"]} == {"dshm", "results"}


# --- the image the pods run: the repository's Dockerfile ------------------------------------

REPOSITORY = Path(hwbench.__file__).resolve().parent.parent


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPOSITORY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPOSITORY / "pyproject.toml").read_text())


def test_the_dockerfile_installs_what_the_pods_run(capsys):
    """No Docker here: the Dockerfile is read, and what it installs is held against the README's
    install, pyproject's extras and what a generated manifest's pod command needs."""
    instructions = _dockerfile()
    args = dict(value.split("=", 1) for kind, value in instructions if kind == "ARG")
    (base,) = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], v) for k, v in instructions if k == "FROM"]
    assert base.startswith("nvidia/cuda:") and "-devel-" in base  # the default --device cuda; nvcc for DeepSpeed
    (install,) = [shlex.split(v) for k, v in instructions if k == "RUN" and "pip install" in v]
    packages = [word for word in install[install.index("install") + 1:] if not word.startswith("-")]
    readme_torch = re.search(r"pip install (torch==\S+) -e \. ", (REPOSITORY / "README.md").read_text()).group(1)
    assert readme_torch in packages  # the torch the README's set-up installs
    (local,) = [p for p in packages if p.startswith(".")]
    extras = set(filter(None, (re.fullmatch(r"\.(?:\[([\w,]+)\])?", local).group(1) or "").split(",")))
    optional = _pyproject()["project"]["optional-dependencies"]
    assert extras <= set(optional)
    # a manifest that runs --engine deepspeed needs the extra that brings deepspeed
    job = manifest(capsys, "--nnodes", "1", "--nproc-per-node", "2", "--engine", "deepspeed", *TINY)
    command = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "--engine deepspeed" in command
    assert {name for name, requirements in optional.items()
            if any(re.match(r"deepspeed\b", r) for r in requirements) and name != "test"} <= extras
    # pip needs pyproject, its readme and the package, all copied and none left out of the build context
    copied = {source for kind, value in instructions if kind == "COPY" for source in value.split()[:-1]}
    needed = {"pyproject.toml", _pyproject()["project"]["readme"], "hwbench"}
    assert needed <= copied
    ignored = (REPOSITORY / ".dockerignore").read_text().splitlines()
    assert {f"!{path}" for path in needed} <= set(ignored)
    # the pod runs `exec hwbench run ...` through /bin/sh: the venv's bin is first on PATH
    assert shlex.split(command)[:2] == ["exec", "hwbench"]
    (venv,) = [v.split()[-1] for k, v in instructions if k == "RUN" and "-m venv" in v]
    (path,) = [v.split("=", 1)[1] for k, v in instructions if k == "ENV" and v.startswith("PATH=")]
    assert path.split(":")[0] == f"{venv}/bin"


def test_k8s_without_an_image_names_the_one_to_build(capsys):
    assert hwbench.cli.main(["k8s", "--nnodes", "2", "--nproc-per-node", "8", *TINY]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    image = f"REGISTRY/hwbench:{hwbench.__version__}"
    assert "--image is required" in captured.err and "this repository's Dockerfile" in captured.err
    assert f"docker build -t {image} . && docker push {image}, then --image {image}" in captured.err
    assert "\n## The image\n" in (REPOSITORY / "docs" / "kubernetes.md").read_text()  # the page it names
