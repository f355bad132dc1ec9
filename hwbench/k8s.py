"""`hwbench k8s`: print a Kubeflow PyTorchJob manifest that runs `hwbench run` on N pods.

A multi-node benchmark on Kubernetes needs the same `hwbench run` on every pod,
each told its node rank and where node 0 is. The Kubeflow training operator
does the rendezvous bookkeeping: for a `PyTorchJob` (apiVersion
`kubeflow.org/v1`) it creates one Master pod and N-1 Worker pods, a service
for the master, and sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE (pods) and RANK
(the pod's index, master 0) in every pod. This module turns

    hwbench k8s --nnodes N --nproc-per-node G --image IMG [k8s options] [run options]

into such a manifest on stdout, for `kubectl create -f`. Every pod runs

    hwbench run <run options> --nnodes N --nproc-per-node G --node-rank "$RANK"
        --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --out /results/runs

and hwbench's launcher starts G local ranks there. The run options are checked
here exactly as `hwbench run` checks them (hwbench.commands.run.parse_run_spec, paths
excepted: they are the pod's), so a layout that does not fit N x G ranks is
refused before anything reaches the cluster. Nothing here talks to a cluster.

Pieces: `job_from_argv` (parse and validate, -> K8sJob), `build_manifest`
(pure, K8sJob -> dict), `render` (dict -> YAML text with a comment header),
`main` (what the CLI calls). See docs/kubernetes.md.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from hwbench import __version__
from hwbench.device.kinds import KINDS

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
# Kubeflow Trainer v2: a TrainJob runs on a training runtime; torch-distributed is the one it ships
# for PyTorch, and its torch plugin sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
# PET_MASTER_ADDR and PET_MASTER_PORT in the trainer container (named `node`).
TRAINJOB_API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINJOB_KIND = "TrainJob"
TRAINJOB_CONTAINER = "node"
DEFAULT_RUNTIME = "torch-distributed"
APIS = ("pytorchjob", "trainjob")
TRAINJOB_RESERVED_ENV = frozenset({"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                                   "PET_MASTER_PORT"})
CONTAINER_NAME = "pytorch"  # the operator finds the training container (and its port) by this name
PORT_NAME = "pytorchjob-port"  # the operator reads MASTER_PORT from the Master container's port of this name
DEFAULT_MASTER_PORT = 23456  # the operator's own default for that port
RESULTS_MOUNT = "/results"
POD_OUT = RESULTS_MOUNT + "/runs"
SHM_MOUNT = "/dev/shm"
DEFAULT_SHM_SIZE = "16Gi"
RESTART_POLICIES = ("Never", "OnFailure", "ExitCode", "Always")
DEFAULT_RESTART_POLICY = "Never"  # a benchmark that failed should say so, not quietly run again
DEFAULT_DEVICE = "cuda"
# The kinds a pod may request: the accelerators, then the CPU (which requests no device)
POD_DEVICES = tuple(sorted(KINDS, key=lambda name: KINDS[name].k8s_resource is None))
DEVICE_RESOURCES = {name: kind.k8s_resource for name, kind in KINDS.items()}
# Variables copied from the shell that runs `hwbench k8s` into every pod.
PASS_THROUGH_PREFIXES = {name: kind.env_prefixes for name, kind in KINDS.items()}
# Set per pod by the operator or the device plugin: never copied from this machine, refused in --env.
RESERVED_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK",
                          *(name for kind in KINDS.values() for name in kind.device_plugin_env)})
# `hwbench run` options the manifest generates itself (per pod).
LAUNCHER_OPTIONS = ("--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port",
                    "--rdzv-endpoint")
MAX_LABEL = 63  # DNS label: pod and service names are <name>-master-0, <name>-worker-<i>

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # DNS-1123 label (namespaces)
# The training operator's webhook wants a job name that is a DNS-1035 label (it names a
# Service after it): a leading letter, so `2node-test` passes DNS-1123 and is refused.
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_CPU_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class K8sJob:
    """Every setting of one generated PyTorchJob, validated."""

    name: str
    image: str
    nnodes: int
    nproc_per_node: int
    device: str  # a kind of hwbench.device.kinds (never auto: a pod's device must be known to request it)
    model: str
    run_args: tuple[str, ...]  # `hwbench run` options, without the launcher ones the manifest adds
    out_dir: str  # where results land inside the pod
    namespace: str | None = None
    results_claim: str | None = None  # PersistentVolumeClaim for /results; None: an emptyDir
    shm_size: str = DEFAULT_SHM_SIZE
    restart_policy: str = DEFAULT_RESTART_POLICY
    backoff_limit: int = 0
    active_deadline_s: int | None = None
    master_port: int = DEFAULT_MASTER_PORT
    cpu: str | None = None
    memory: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # (name, value) for every pod
    env_from_shell: tuple[str, ...] = ()  # which of env came from the environment of `hwbench k8s`
    hold_s: int = 0  # keep the pod alive this long after the run, for `kubectl cp`
    api: str = "pytorchjob"  # or "trainjob" (Kubeflow Trainer v2)
    runtime: str = DEFAULT_RUNTIME  # the TrainJob's training runtime

    @property
    def pod_command(self) -> list[str]:
        """The container command: the same `hwbench run` on every pod, rank from the operator
        (RANK, MASTER_ADDR, MASTER_PORT for a PyTorchJob; PET_* for a TrainJob)."""
        run = " ".join(shlex.quote(a) for a in ("hwbench", "run", *self.run_args))
        rank, address, port = (("PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT") if self.api == "trainjob"
                               else ("RANK", "MASTER_ADDR", "MASTER_PORT"))
        launch = (f'--nnodes {self.nnodes} --nproc-per-node {self.nproc_per_node} --node-rank "${rank}" '
                  f'--master-addr "${address}" --master-port "${port}"')
        if self.hold_s:
            script = (f"{run} {launch}; rc=$?; echo \"hwbench: run exited $rc; pod held {self.hold_s}s for "
                      f"kubectl cp\"; sleep {self.hold_s}; exit $rc")
        else:
            script = f"exec {run} {launch}"
        return ["/bin/sh", "-c", script]



def default_name(model: str, nnodes: int, nproc: int, api: str = "pytorchjob") -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "run"
    suffix = f"-{nnodes}x{nproc}"
    room = name_room(nnodes, api) - len("hwbench-") - len(suffix)
    return f"hwbench-{slug[:room].rstrip('-')}{suffix}"


def name_room(nnodes: int, api: str = "pytorchjob") -> int:
    """Longest job name whose pod and service names stay DNS labels: <name>-worker-<i> for a
    PyTorchJob, the JobSet's <name>-node-0-<i> for a TrainJob."""
    if api == "trainjob":
        return MAX_LABEL - len(f"-{TRAINJOB_CONTAINER}-0-{nnodes - 1}")
    longest_suffix = f"-worker-{nnodes - 2}" if nnodes > 1 else "-master-0"
    return MAX_LABEL - max(len(longest_suffix), len("-master-0"))


def pass_through_env(device: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    prefixes = PASS_THROUGH_PREFIXES[device]
    return sorted((k, v) for k, v in environ.items() if k.startswith(prefixes) and k not in RESERVED_ENV)


def under(path: str, folder: str) -> bool:
    if not posixpath.isabs(path):
        return False
    normal = posixpath.normpath(path)
    return normal == folder or normal.startswith(folder + "/")


class Quoted(str):
    """A string YAML must write in quotes. PyYAML reads YAML 1.1 and leaves `1e3`, `0o17`
    or `0x1F` bare, but kubectl's reader (YAML 1.2) takes them for the numbers 1000.0,
    15 and 31, which a string field (an env value, a quantity, a label) refuses."""


# What a YAML 1.2 reader (kubectl's) takes for something other than a string when it is
# written bare: numbers in every YAML 1.2 spelling, booleans, null, the empty string.
_YAML12_NOT_TEXT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"
                              r"|[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                              r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)|null|Null|NULL|~"
                              r"|true|True|TRUE|false|False|FALSE|)$")


class ManifestDumper(yaml.SafeDumper):
    """PyYAML's safe dumper writing strings so that a YAML 1.2 reader reads strings back:
    Quoted values always in quotes, any other string in quotes where it would read as a
    number, boolean or null."""


def _represent_text(dumper: yaml.SafeDumper, value: str):
    quoted = isinstance(value, Quoted) or bool(_YAML12_NOT_TEXT.match(value))
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style='"' if quoted else None)


ManifestDumper.add_representer(str, _represent_text)
ManifestDumper.add_representer(Quoted, _represent_text)


def _labels(job: K8sJob) -> dict[str, str]:
    return {"app.kubernetes.io/name": "hwbench", "app.kubernetes.io/instance": Quoted(job.name),
            "app.kubernetes.io/version": Quoted(__version__)}


def _resources(job: K8sJob) -> dict[str, Any]:
    """requests and limits of one pod (node): the accelerators, --cpu, --memory."""
    accelerator = DEVICE_RESOURCES[job.device]
    # a quantity as text: the kubernetes client's typed model refuses an integer
    limits = {accelerator: Quoted(job.nproc_per_node)} if accelerator else {}
    requests = {**limits, **{name: Quoted(value) for name, value in (("cpu", job.cpu), ("memory", job.memory))
                             if value}}
    return {name: value for name, value in (("requests", requests), ("limits", limits)) if value}


def _env(job: K8sJob) -> list[dict[str, Any]]:
    return [{"name": k, "value": Quoted(v)} for k, v in job.env]


def _volumes(job: K8sJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the pod's volumes, the container's mounts): shared memory and the results volume."""
    results_volume: dict[str, Any] = (
        {"name": "results", "persistentVolumeClaim": {"claimName": job.results_claim}} if job.results_claim
        else {"name": "results", "emptyDir": {}})
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": Quoted(job.shm_size)}}, results_volume]
    mounts = [{"name": "dshm", "mountPath": SHM_MOUNT}, {"name": "results", "mountPath": RESULTS_MOUNT}]
    return volumes, mounts


def _replica_spec(job: K8sJob, replicas: int) -> dict[str, Any]:
    resources = _resources(job)
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": job.image, "command": job.pod_command,
                                 "ports": [{"name": PORT_NAME, "containerPort": job.master_port}]}
    if job.env:
        container["env"] = _env(job)
    if resources:
        container["resources"] = resources
    volumes, container["volumeMounts"] = _volumes(job)
    return {"replicas": replicas, "restartPolicy": job.restart_policy,
            "template": {"metadata": {"labels": _labels(job)}, "spec": {"containers": [container], "volumes": volumes}}}


def build_manifest(job: K8sJob) -> dict[str, Any]:
    """The manifest for ``job``: a PyTorchJob, or with ``api="trainjob"`` a TrainJob."""
    return build_trainjob(job) if job.api == "trainjob" else build_pytorchjob(job)


def _metadata(job: K8sJob) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": job.name}
    if job.namespace:
        metadata["namespace"] = job.namespace
    metadata["labels"] = _labels(job)
    metadata["annotations"] = {
        "hwbench/version": Quoted(__version__),
        "hwbench/layout": Quoted(f"{job.nnodes} pods x {job.nproc_per_node} ranks, device {job.device}"),
        "hwbench/run-args": Quoted(" ".join(shlex.quote(a) for a in job.run_args)),
        "hwbench/env-passed": Quoted(",".join(k for k, _ in job.env)),
    }
    return metadata


def build_trainjob(job: K8sJob) -> dict[str, Any]:
    """The TrainJob (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2) for ``job``: nnodes
    nodes of the training runtime (torch-distributed), each running the same command; the
    runtime owns restarts, so --restart-policy and its kin have no place here."""
    trainer: dict[str, Any] = {"image": job.image, "command": job.pod_command, "numNodes": job.nnodes,
                               "numProcPerNode": job.nproc_per_node}
    if job.env:
        trainer["env"] = _env(job)
    resources = _resources(job)
    if resources:
        trainer["resourcesPerNode"] = resources
    volumes, mounts = _volumes(job)
    overrides = [{"targetJobs": [{"name": TRAINJOB_CONTAINER}],
                  "spec": {"containers": [{"name": TRAINJOB_CONTAINER, "volumeMounts": mounts}], "volumes": volumes}}]
    return {"apiVersion": TRAINJOB_API_VERSION, "kind": TRAINJOB_KIND, "metadata": _metadata(job),
            "spec": {"runtimeRef": {"name": job.runtime}, "trainer": trainer, "podTemplateOverrides": overrides}}


def build_pytorchjob(job: K8sJob) -> dict[str, Any]:
    """The PyTorchJob (kubeflow.org/v1) for ``job``: a Master and nnodes-1 Workers running the same command."""
    replica_specs: dict[str, Any] = {"Master": _replica_spec(job, 1)}
    if job.nnodes > 1:
        replica_specs["Worker"] = _replica_spec(job, job.nnodes - 1)
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "backoffLimit": job.backoff_limit}
    if job.active_deadline_s is not None:
        run_policy["activeDeadlineSeconds"] = job.active_deadline_s
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": _metadata(job),
            "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replica_specs}}


def render(manifest: Mapping[str, Any]) -> str:
    """YAML for ``manifest`` after a comment header with the kubectl commands to use it."""
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace")
    ns = f" -n {namespace}" if namespace else ""
    annotations = manifest["metadata"].get("annotations", {})
    env = annotations.get("hwbench/env-passed") or "none"
    layout = annotations.get("hwbench/layout", "")
    if manifest["kind"] == TRAINJOB_KIND:
        runtime = manifest["spec"]["runtimeRef"]["name"]
        pods = f"jobset.sigs.k8s.io/jobset-name={name}"
        usage = [
            f"# hwbench {__version__}: Kubeflow Trainer TrainJob '{name}' ({layout}), runtime {runtime}.",
            f"# Needs Kubeflow Trainer v2 and its {runtime} ClusterTrainingRuntime in the cluster. Use it with:",
            "#   kubectl create -f job.yaml",
            f"#   kubectl get trainjobs{ns}",
            f"#   kubectl get pods{ns} -l {pods}",
            f"#   kubectl logs{ns} -f -l {pods},batch.kubernetes.io/job-completion-index=0",
            f"#   kubectl delete trainjob{ns} {name}",
        ]
    else:
        usage = [
            f"# hwbench {__version__}: Kubeflow PyTorchJob '{name}' ({layout}).",
            "# Needs the Kubeflow training operator in the cluster. Use it with:",
            "#   kubectl create -f job.yaml",
            f"#   kubectl get pytorchjobs{ns}",
            f"#   kubectl get pods{ns} -l app.kubernetes.io/instance={name}",
            f"#   kubectl logs{ns} -f {name}-master-0",
            f"#   kubectl delete pytorchjob{ns} {name}",
        ]
    header = [*usage, f"# Results: {RESULTS_MOUNT} in each pod (see docs/kubernetes.md for copying them out).",
              f"# Environment passed to every pod: {env}"]
    body = yaml.dump(dict(manifest), Dumper=ManifestDumper, sort_keys=False, width=1000)
    return "\n".join(header) + "\n" + body
