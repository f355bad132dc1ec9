"""`hwbench k8s`: the printed PyTorchJob manifest, parsed back as kubectl would read it."""

from __future__ import annotations

import shlex

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
        assert c["resources"]["limits"] == {"nvidia.com/gpu": 8}
        assert c["resources"]["requests"] == {"nvidia.com/gpu": 8}
        words = pod_words(spec)
        assert words[:3] == ["exec", "hwbench", "run"]
        assert words[3:10] == ["--device", "cuda", "--model", "1.3b", "--tp", "2", "--pp"]
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
    assert container(replicas["Master"])["resources"]["limits"] == {"nvidia.com/gpu": 4}


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
    assert c["resources"]["requests"] == {"nvidia.com/gpu": 2, "cpu": "16", "memory": "64Gi"}
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
    assert c["resources"]["limits"] == {"huawei.com/Ascend910": 8}
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
    (["--nnodes", "0", "--nproc-per-node", "1"], "--nnodes '0'"),
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
    assert "hwbench: error: --nnodes '0'" in capsys.readouterr().err
