"""`hwbench k8s`: print a Kubeflow PyTorchJob manifest that runs the same `hwbench run`
on every pod (docs/kubernetes.md). Options not listed here are `hwbench run` options,
checked here as the pod will check them and passed to every pod."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence

from hwbench import __version__
from hwbench.arguments import argument
from hwbench.errors import UsageError
from hwbench.k8s import (
    _CPU_QUANTITY,
    _DNS_1035_LABEL,
    _DNS_LABEL,
    _DNS_SUBDOMAIN,
    _ENV_NAME,
    _QUANTITY,
    APIS,
    DEFAULT_DEVICE,
    DEFAULT_MASTER_PORT,
    DEFAULT_RESTART_POLICY,
    DEFAULT_RUNTIME,
    DEFAULT_SHM_SIZE,
    LAUNCHER_OPTIONS,
    MAX_LABEL,
    POD_DEVICES,
    POD_OUT,
    RESERVED_ENV,
    RESTART_POLICIES,
    RESULTS_MOUNT,
    SHM_MOUNT,
    TRAINJOB_RESERVED_ENV,
    K8sJob,
    default_name,
    name_room,
    pass_through_env,
    under,
)

DESCRIPTION = ("Print a Kubeflow PyTorchJob manifest that runs `hwbench run` on --nnodes pods. Options not listed "
               "here are `hwbench run` options, passed to every pod.")


def _matching(flag: str, pattern: re.Pattern, accepted: str, max_length: int | None = None):
    return argument(flag, valid=lambda text: bool(pattern.match(text)) and (max_length is None
                                                                             or len(text) <= max_length),
                    accepts=accepted)


EXAMPLE_IMAGE = f"REGISTRY/hwbench:{__version__}"  # REGISTRY: where the cluster pulls images from


_image = argument("--image", valid=lambda text: bool(text) and not any(c.isspace() for c in text),
                  accepts="a container image reference without spaces (e.g. registry.example.com/hwbench:0.1)")


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _ENV_NAME.match(key):
        raise UsageError(f"--env {text!r} is not accepted; give KEY=VALUE with KEY a variable name")
    if key in RESERVED_ENV:
        raise UsageError(f"--env {text!r} is not accepted; {key} is set in each pod by the operator or the device "
                         f"plugin; accepted: any other KEY=VALUE")
    return key, value


def configure(parser: argparse.ArgumentParser) -> None:
    from hwbench.commands.run import run_option_flags

    parser.also_known = run_option_flags()  # type: ignore[attr-defined]  # a Parser's: the run options it passes on
    parser.add_argument("--api", default="pytorchjob", type=argument("--api", choices=APIS),
                        help="pytorchjob: the training operator's PyTorchJob (kubeflow.org/v1, default); trainjob: "
                             "Kubeflow Trainer v2's TrainJob (trainer.kubeflow.org/v1alpha1)")
    parser.add_argument("--runtime", type=_matching("--runtime", _DNS_SUBDOMAIN, "the name of a training runtime "
                                                    "(lowercase, digits, '-', '.')", 253),
                        help=f"--api trainjob: the ClusterTrainingRuntime to run on (default: {DEFAULT_RUNTIME})")
    parser.add_argument("--nnodes", required=True, type=argument("--nnodes", int, minimum=1),
                        help="pods (nodes) in the job")
    parser.add_argument("--nproc-per-node", required=True, type=argument("--nproc-per-node", int, minimum=1),
                        help="ranks per pod; also the accelerators each pod requests")
    parser.add_argument("--image", type=_image, help="container image with hwbench installed (required; the "
                        "repository's Dockerfile builds one: docs/kubernetes.md)")
    parser.add_argument("--name", type=_matching("--name", _DNS_1035_LABEL, "a DNS-1035 label, as the training "
                                                 "operator requires: lowercase letters, digits and '-', starting "
                                                 "with a letter and ending with a letter or digit"),
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
    parser.add_argument("--restart-policy", default=DEFAULT_RESTART_POLICY, type=argument("--restart-policy",
                        choices=RESTART_POLICIES),
                        help=f"{', '.join(RESTART_POLICIES)} (default: {DEFAULT_RESTART_POLICY})")
    parser.add_argument("--backoff-limit", default=0, type=argument("--backoff-limit", int, minimum=0),
                        help="restarts before the job is marked Failed (default: 0)")
    parser.add_argument("--active-deadline", type=argument("--active-deadline", int, minimum=1),
                        help="seconds after which the operator ends the job (runPolicy.activeDeadlineSeconds)")
    parser.add_argument("--master-port", default=DEFAULT_MASTER_PORT,
                        type=argument("--master-port", int, minimum=1, maximum=65535),
                        help=f"rendezvous port on the master pod (default: {DEFAULT_MASTER_PORT})")
    parser.add_argument("--cpu", type=_matching("--cpu", _CPU_QUANTITY, "a CPU quantity such as 16 or 500m"),
                        help="CPU request per pod")
    parser.add_argument("--memory", type=_matching("--memory", _QUANTITY, "a Kubernetes quantity such as 200Gi"),
                        help="memory request per pod")
    parser.add_argument("--env", action="append", default=[], type=_env_pair, metavar="KEY=VALUE",
                        help="environment variable for every pod (repeatable)")
    parser.add_argument("--hold", default=0, type=argument("--hold", int, minimum=0),
                        help="seconds each pod stays up after the run, so that results can be copied out with "
                        "kubectl cp (default: 0)")


def job_from_argv(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> K8sJob:
    """Parse `hwbench k8s` arguments into a validated K8sJob (UsageError, one line, on bad input).

    ``environ`` (default os.environ) supplies the NCCL_*/HCCL_* (and for npu
    ASCEND_*) variables copied into every pod."""
    from hwbench.catalog import load_catalog
    from hwbench.commands.run import parse_run_options
    from hwbench.spec import build_run_spec

    environ = os.environ if environ is None else environ
    parser = _parser()
    args, run_args = parser.parse_known_args(list(argv))
    if args.image is None:
        raise UsageError(f"--image is required: the container image every pod runs, with hwbench installed; build "
                         f"one from this repository's Dockerfile and push it where the cluster pulls from: docker "
                         f"build -t {EXAMPLE_IMAGE} . && docker push {EXAMPLE_IMAGE}, then --image {EXAMPLE_IMAGE} "
                         "(docs/kubernetes.md, 'The image')")
    options = parse_run_options(run_args, outer=parser)
    for flag in LAUNCHER_OPTIONS[2:]:  # --nnodes and --nproc-per-node are this command's own
        if getattr(options, flag[2:].replace("-", "_")) is not None:
            raise UsageError(f"{flag} is not accepted among the run options of `hwbench k8s`; the manifest sets "
                             f"{', '.join(LAUNCHER_OPTIONS[2:])} for each pod (use --nnodes, --nproc-per-node "
                             "and --master-port of `hwbench k8s`)")
    if options.device is None:  # a default that picks the accelerator the pods request: said, never silent
        from hwbench.device.kinds import KINDS

        print(f"hwbench: note: no --device given: the pods run --device {DEFAULT_DEVICE} and request "
              f"{KINDS[DEFAULT_DEVICE].k8s_resource}; give --device {'|'.join(POD_DEVICES)} for another kind",
              file=sys.stderr)
    # Validated exactly as `hwbench run` on the pod will, with the pod's defaults where the user gave none.
    options = options.merged(device=options.device or DEFAULT_DEVICE, out=options.out or POD_OUT)
    spec = build_run_spec(options.merged(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node), load_catalog(),
                          check_paths=False)
    if spec.device not in POD_DEVICES:
        raise UsageError(f"--device {spec.device!r} is not accepted for `hwbench k8s`; a pod requests its accelerators "
                         f"by name, so give an explicit --device {'|'.join(POD_DEVICES)} (default: {DEFAULT_DEVICE})")
    if not under(spec.out_dir, RESULTS_MOUNT):
        print(f"hwbench: warning: --out {spec.out_dir} is outside the results volume {RESULTS_MOUNT}; the result "
              "files will be lost with the pod's filesystem", file=sys.stderr)

    _check_api_options(args, argv)
    name = args.name or default_name(spec.model, args.nnodes, args.nproc_per_node, args.api)
    room = name_room(args.nnodes, args.api)
    if len(name) > room:
        pods = "<name>-node-0-<i>" if args.api == "trainjob" else "<name>-worker-<i>"
        raise UsageError(f"--name {name!r} is too long: {len(name)} characters; accepted: at most "
                         f"{room} for {args.nnodes} pods, so that pod names {pods} stay within {MAX_LABEL}")

    env: dict[str, str] = dict(pass_through_env(spec.device, environ))
    from_shell = tuple(env)
    for key, value in args.env:
        env[key] = value
    from_shell = tuple(k for k in from_shell if k not in dict(args.env))

    return K8sJob(
        name=name, image=args.image, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, device=spec.device,
        model=spec.model, run_args=tuple(options.to_argv()), out_dir=spec.out_dir, namespace=args.namespace,
        results_claim=args.results_claim, shm_size=args.shm_size, restart_policy=args.restart_policy,
        backoff_limit=args.backoff_limit, active_deadline_s=args.active_deadline, master_port=args.master_port,
        cpu=args.cpu, memory=args.memory, env=tuple(env.items()), env_from_shell=from_shell, hold_s=args.hold,
        api=args.api, runtime=args.runtime or DEFAULT_RUNTIME)


# PyTorchJob settings that a TrainJob does not have: its training runtime (a JobSet) owns
# restarts, deadlines and the rendezvous port.
PYTORCHJOB_ONLY = ("--restart-policy", "--backoff-limit", "--active-deadline", "--master-port")


def _check_api_options(args: argparse.Namespace, argv: Sequence[str]) -> None:
    given = {token.split("=", 1)[0] for token in argv}
    if args.api == "trainjob":
        for flag in PYTORCHJOB_ONLY:
            if flag in given:
                raise UsageError(f"{flag} is not accepted with --api trainjob; the TrainJob's training runtime "
                                 f"sets it (accepted with --api pytorchjob)")
        for key, _ in args.env:
            if key in TRAINJOB_RESERVED_ENV:
                raise UsageError(f"--env {key}=... is not accepted with --api trainjob; the runtime's torch plugin "
                                 "sets it in every node")
    elif args.runtime:
        raise UsageError("--runtime is accepted only with --api trainjob")



def _parser() -> argparse.ArgumentParser:
    from hwbench.cli import Parser

    parser = Parser(prog="hwbench k8s", description=DESCRIPTION, allow_abbrev=False)
    configure(parser)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> K8sJob:
    """The job, validated (the run options the way `hwbench run` on the pod will)."""
    return job_from_argv(argv)


def main(job: K8sJob) -> int:
    """Print the manifest on stdout."""
    from hwbench.k8s import build_manifest, render

    if job.results_claim is None:
        print(f"hwbench: note: no --results-claim, so {RESULTS_MOUNT} is an emptyDir: results vanish with the pod "
              "(copy them out with kubectl cp while it runs, see --hold)", file=sys.stderr)
    sys.stdout.write(render(build_manifest(job)))
    return 0
