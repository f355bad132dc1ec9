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
here exactly as `hwbench run` checks them (hwbench.cli.parse_run_spec, paths
excepted: they are the pod's), so a layout that does not fit N x G ranks is
refused before anything reaches the cluster. Nothing here talks to a cluster.

Pieces: `job_from_argv` (parse and validate, -> K8sJob), `build_manifest`
(pure, K8sJob -> dict), `render` (dict -> YAML text with a comment header),
`main` (what the CLI calls). See docs/kubernetes.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import posixpath
import re
import shlex
import sys
from typing import Any, Mapping, Sequence

import yaml

from hwbench import __version__
from hwbench.errors import UsageError

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
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
POD_DEVICES = ("cuda", "npu", "cpu")
DEVICE_RESOURCES = {"cuda": "nvidia.com/gpu", "npu": "huawei.com/Ascend910", "cpu": None}
# Variables copied from the shell that runs `hwbench k8s` into every pod.
_COMM = ("NCCL_", "TORCH_NCCL_", "HCCL_")
PASS_THROUGH_PREFIXES = {"cuda": _COMM, "npu": (*_COMM, "ASCEND_"), "cpu": _COMM}
# Set per pod by the operator or the device plugin: never copied from this machine, refused in --env.
RESERVED_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK",
                          "CUDA_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"})
# `hwbench run` options the manifest generates itself (per pod).
LAUNCHER_OPTIONS = ("--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port",
                    "--rdzv-endpoint")
MAX_LABEL = 63  # DNS-1123 label: pod and service names are <name>-master-0, <name>-worker-<i>

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
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
    device: str  # cuda, npu or cpu (never auto: a pod's device must be known to request it)
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

    @property
    def pod_command(self) -> list[str]:
        """The container command: the same `hwbench run` on every pod, rank from the operator."""
        run = " ".join(shlex.quote(a) for a in ("hwbench", "run", *self.run_args))
        launch = (f'--nnodes {self.nnodes} --nproc-per-node {self.nproc_per_node} --node-rank "$RANK" '
                  f'--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"')
        if self.hold_s:
            script = (f"{run} {launch}; rc=$?; echo \"hwbench: run exited $rc; pod held {self.hold_s}s for "
                      f"kubectl cp\"; sleep {self.hold_s}; exit $rc")
        else:
            script = f"exec {run} {launch}"
        return ["/bin/sh", "-c", script]



def _int_at_least(option: str, minimum: int, maximum: int | None = None):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            accepted = f"an integer from {minimum} to {maximum}" if maximum is not None else f"an integer >= {minimum}"
            raise UsageError(f"{option} {text!r} is not accepted; give {accepted}")
        return value
    return convert


def _matching(option: str, pattern: re.Pattern, accepted: str, max_length: int | None = None):
    def convert(text: str) -> str:
        if not pattern.match(text) or (max_length is not None and len(text) > max_length):
            raise UsageError(f"{option} {text!r} is not accepted; give {accepted}")
        return text
    return convert


def _image(text: str) -> str:
    if not text or any(c.isspace() for c in text):
        raise UsageError(f"--image {text!r} is not accepted; give a container image reference without spaces "
                         "(e.g. registry.example.com/hwbench:0.1)")
    return text


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _ENV_NAME.match(key):
        raise UsageError(f"--env {text!r} is not accepted; give KEY=VALUE with KEY a variable name")
    if key in RESERVED_ENV:
        raise UsageError(f"--env {text!r} is not accepted; {key} is set in each pod by the operator or the device "
                         f"plugin; accepted: any other KEY=VALUE")
    return key, value


def _build_parser() -> argparse.ArgumentParser:
    from hwbench.cli import _Parser  # one line, exit 2, for a bad option

    parser = _Parser(prog="hwbench k8s", allow_abbrev=False,
                     description="Print a Kubeflow PyTorchJob manifest that runs `hwbench run` on --nnodes pods. "
                     "Options not listed here are `hwbench run` options, passed to every pod.")
    parser.add_argument("--nnodes", required=True, type=_int_at_least("--nnodes", 1), help="pods (nodes) in the job")
    parser.add_argument("--nproc-per-node", required=True, type=_int_at_least("--nproc-per-node", 1),
                        help="ranks per pod; also the accelerators each pod requests")
    parser.add_argument("--image", required=True, type=_image, help="container image with hwbench installed")
    parser.add_argument("--name", type=_matching("--name", _DNS_LABEL, "a DNS-1123 label: lowercase letters, digits "
                                                 "and '-', starting and ending with a letter or digit"),
                        help="job name (default: hwbench-<model>-<N>x<G>)")
    parser.add_argument("--namespace", type=_matching("--namespace", _DNS_LABEL, "a DNS-1123 label of at most 63 "
                                                      "characters", MAX_LABEL), help="namespace of the job")
    parser.add_argument("--results-claim", type=_matching("--results-claim", _DNS_SUBDOMAIN, "the name of a "
                                                          "PersistentVolumeClaim (lowercase, digits, '-', '.')", 253),
                        help=f"PersistentVolumeClaim mounted at {RESULTS_MOUNT} (default: an emptyDir, which "
                        "disappears with the pod)")
    parser.add_argument("--shm-size", default=DEFAULT_SHM_SIZE,
                        type=_matching("--shm-size", _QUANTITY, "a Kubernetes quantity such as 16Gi"),
                        help=f"size of the memory-backed {SHM_MOUNT} (default: {DEFAULT_SHM_SIZE})")
    parser.add_argument("--restart-policy", default=DEFAULT_RESTART_POLICY, type=_choice("--restart-policy",
                        RESTART_POLICIES), help=f"{', '.join(RESTART_POLICIES)} (default: {DEFAULT_RESTART_POLICY})")
    parser.add_argument("--backoff-limit", default=0, type=_int_at_least("--backoff-limit", 0),
                        help="restarts before the job is marked Failed (default: 0)")
    parser.add_argument("--active-deadline", type=_int_at_least("--active-deadline", 1),
                        help="seconds after which the operator ends the job (runPolicy.activeDeadlineSeconds)")
    parser.add_argument("--master-port", default=DEFAULT_MASTER_PORT, type=_int_at_least("--master-port", 1, 65535),
                        help=f"rendezvous port on the master pod (default: {DEFAULT_MASTER_PORT})")
    parser.add_argument("--cpu", type=_matching("--cpu", _CPU_QUANTITY, "a CPU quantity such as 16 or 500m"),
                        help="CPU request per pod")
    parser.add_argument("--memory", type=_matching("--memory", _QUANTITY, "a Kubernetes quantity such as 200Gi"),
                        help="memory request per pod")
    parser.add_argument("--env", action="append", default=[], type=_env_pair, metavar="KEY=VALUE",
                        help="environment variable for every pod (repeatable)")
    parser.add_argument("--hold", default=0, type=_int_at_least("--hold", 0),
                        help="seconds each pod stays up after the run, so that results can be copied out with "
                        "kubectl cp (default: 0)")
    return parser


def _choice(option: str, choices: Sequence[str]):
    def convert(text: str) -> str:
        if text not in choices:
            raise UsageError(f"{option} {text!r} is not accepted; accepted: {', '.join(choices)}")
        return text
    return convert


def _refuse_launcher_options(run_args: Sequence[str]) -> None:
    for token in run_args:
        option = token.split("=", 1)[0]
        if not option.startswith("--") or len(option) < 4:
            continue
        for launcher in LAUNCHER_OPTIONS:
            if launcher.startswith(option):  # argparse would take an abbreviation for the option itself
                raise UsageError(f"{token} is not accepted among the run options of `hwbench k8s`; the manifest sets "
                                 f"{', '.join(LAUNCHER_OPTIONS[2:])} for each pod (use --nnodes, --nproc-per-node "
                                 "and --master-port of `hwbench k8s`)")


def _default_name(model: str, nnodes: int, nproc: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "run"
    suffix = f"-{nnodes}x{nproc}"
    room = _name_room(nnodes) - len("hwbench-") - len(suffix)
    return f"hwbench-{slug[:room].rstrip('-')}{suffix}"


def _name_room(nnodes: int) -> int:
    """Longest job name whose pod and service names (<name>-worker-<i>) stay DNS-1123 labels."""
    longest_suffix = f"-worker-{nnodes - 2}" if nnodes > 1 else "-master-0"
    return MAX_LABEL - max(len(longest_suffix), len("-master-0"))


def _pass_through_env(device: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    prefixes = PASS_THROUGH_PREFIXES[device]
    return sorted((k, v) for k, v in environ.items() if k.startswith(prefixes) and k not in RESERVED_ENV)


def _under(path: str, folder: str) -> bool:
    if not posixpath.isabs(path):
        return False
    normal = posixpath.normpath(path)
    return normal == folder or normal.startswith(folder + "/")


def job_from_argv(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> K8sJob:
    """Parse `hwbench k8s` arguments into a validated K8sJob (UsageError, one line, on bad input).

    ``environ`` (default os.environ) supplies the NCCL_*/HCCL_* (and for npu
    ASCEND_*) variables copied into every pod."""
    from hwbench.cli import parse_run_spec

    environ = os.environ if environ is None else environ
    args, run_args = _build_parser().parse_known_args(list(argv))
    _refuse_launcher_options(run_args)
    launch = ["--nnodes", str(args.nnodes), "--nproc-per-node", str(args.nproc_per_node)]
    # Validate exactly as `hwbench run` on the pod will. The pod defaults go first so that
    # the user's own --device/--out win (argparse keeps the last); comparing with a parse
    # without them tells whether the user gave those options.
    pod_defaults = ["--device", DEFAULT_DEVICE, "--out", POD_OUT]
    spec = parse_run_spec([*pod_defaults, *run_args, *launch], check_paths=False)
    plain = parse_run_spec([*run_args, *launch], check_paths=False)
    if spec.device not in POD_DEVICES:
        raise UsageError(f"--device {spec.device!r} is not accepted for `hwbench k8s`; a pod requests its accelerators "
                         f"by name, so give an explicit --device {'|'.join(POD_DEVICES)} (default: {DEFAULT_DEVICE})")
    added: list[str] = []
    if plain.device != spec.device:
        added += ["--device", spec.device]
    if plain.out_dir != spec.out_dir:
        added += ["--out", POD_OUT]
    elif not _under(spec.out_dir, RESULTS_MOUNT):
        print(f"hwbench: warning: --out {spec.out_dir} is outside the results volume {RESULTS_MOUNT}; the result "
              "files will be lost with the pod's filesystem", file=sys.stderr)

    name = args.name or _default_name(spec.model, args.nnodes, args.nproc_per_node)
    if len(name) > _name_room(args.nnodes):
        raise UsageError(f"--name {name!r} is too long: {len(name)} characters; accepted: at most "
                         f"{_name_room(args.nnodes)} for {args.nnodes} pods, so that pod names "
                         f"<name>-worker-<i> stay within {MAX_LABEL}")

    env: dict[str, str] = dict(_pass_through_env(spec.device, environ))
    from_shell = tuple(env)
    for key, value in args.env:
        env[key] = value
    from_shell = tuple(k for k in from_shell if k not in dict(args.env))

    return K8sJob(
        name=name, image=args.image, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, device=spec.device,
        model=spec.model, run_args=tuple([*run_args, *added]), out_dir=spec.out_dir, namespace=args.namespace,
        results_claim=args.results_claim, shm_size=args.shm_size, restart_policy=args.restart_policy,
        backoff_limit=args.backoff_limit, active_deadline_s=args.active_deadline, master_port=args.master_port,
        cpu=args.cpu, memory=args.memory, env=tuple(env.items()), env_from_shell=from_shell, hold_s=args.hold)


def _labels(job: K8sJob) -> dict[str, str]:
    return {"app.kubernetes.io/name": "hwbench", "app.kubernetes.io/instance": job.name,
            "app.kubernetes.io/version": __version__}


def _replica_spec(job: K8sJob, replicas: int) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    accelerator = DEVICE_RESOURCES[job.device]
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if accelerator:
        requests[accelerator] = limits[accelerator] = job.nproc_per_node
    if job.cpu:
        requests["cpu"] = job.cpu
    if job.memory:
        requests["memory"] = job.memory
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": job.image,
        "command": job.pod_command,
        "ports": [{"name": PORT_NAME, "containerPort": job.master_port}],
    }
    if job.env:
        container["env"] = [{"name": k, "value": v} for k, v in job.env]
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = [{"name": "dshm", "mountPath": SHM_MOUNT},
                                 {"name": "results", "mountPath": RESULTS_MOUNT}]
    results_volume: dict[str, Any] = (
        {"name": "results", "persistentVolumeClaim": {"claimName": job.results_claim}} if job.results_claim
        else {"name": "results", "emptyDir": {}})
    return {
        "replicas": replicas,
        "restartPolicy": job.restart_policy,
        "template": {
            "metadata": {"labels": _labels(job)},
            "spec": {
                "containers": [container],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.shm_size}},
                            results_volume],
            },
        },
    }


def build_manifest(job: K8sJob) -> dict[str, Any]:
    """The PyTorchJob (kubeflow.org/v1) for ``job``: a Master and nnodes-1 Workers running the same command."""
    metadata: dict[str, Any] = {"name": job.name}
    if job.namespace:
        metadata["namespace"] = job.namespace
    metadata["labels"] = _labels(job)
    metadata["annotations"] = {
        "hwbench/version": __version__,
        "hwbench/layout": f"{job.nnodes} pods x {job.nproc_per_node} ranks, device {job.device}",
        "hwbench/run-args": " ".join(shlex.quote(a) for a in job.run_args),
        "hwbench/env-passed": ",".join(k for k, _ in job.env),
    }
    replica_specs: dict[str, Any] = {"Master": _replica_spec(job, 1)}
    if job.nnodes > 1:
        replica_specs["Worker"] = _replica_spec(job, job.nnodes - 1)
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "backoffLimit": job.backoff_limit}
    if job.active_deadline_s is not None:
        run_policy["activeDeadlineSeconds"] = job.active_deadline_s
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replica_specs},
    }


def render(manifest: Mapping[str, Any]) -> str:
    """YAML for ``manifest`` after a comment header with the kubectl commands to use it."""
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"].get("namespace")
    ns = f" -n {namespace}" if namespace else ""
    annotations = manifest["metadata"].get("annotations", {})
    env = annotations.get("hwbench/env-passed") or "none"
    header = [
        f"# hwbench {__version__}: Kubeflow PyTorchJob '{name}' ({annotations.get('hwbench/layout', '')}).",
        "# Needs the Kubeflow training operator in the cluster. Use it with:",
        "#   kubectl create -f job.yaml",
        f"#   kubectl get pytorchjobs{ns}",
        f"#   kubectl get pods{ns} -l app.kubernetes.io/instance={name}",
        f"#   kubectl logs{ns} -f {name}-master-0",
        f"#   kubectl delete pytorchjob{ns} {name}",
        f"# Results: {RESULTS_MOUNT} in each pod (see docs/kubernetes.md for copying them out).",
        f"# Environment passed to every pod: {env}",
    ]
    body = yaml.safe_dump(dict(manifest), sort_keys=False, width=1000)
    return "\n".join(header) + "\n" + body


def main(argv: Sequence[str]) -> int:
    """`hwbench k8s ARGV...`: print the manifest on stdout; UsageError for bad input (the CLI exits 2)."""
    job = job_from_argv(argv)
    if job.results_claim is None:
        print(f"hwbench: note: no --results-claim, so {RESULTS_MOUNT} is an emptyDir: results vanish with the pod "
              "(copy them out with kubectl cp while it runs, see --hold)", file=sys.stderr)
    sys.stdout.write(render(build_manifest(job)))
    return 0
