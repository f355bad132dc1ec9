"""The fields of hwbench.spec's RunSpec, OptimizerSpec and LaunchSpec that keep a run option as given,
else as its default (the workload's training default, or the option's). Written by `python -m
hwbench.options --kept-options > hwbench/kept_options.py` from the options' definitions in
hwbench/options.py (``kept=``); tests/test_run_spec_declaration.py fails when this file differs: change
the option, not this file. A field's type is the option's, with its range (hwbench.fields); None where
the option has no default of its own or the workload's; a default where a result written before the
option existed lacks it (``absent_means_default``): the option's, which that run ran with."""

from __future__ import annotations

import dataclasses

from hwbench.fields import Count, Positive


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeptRunOptions:
    """The run options RunSpec keeps (hwbench.spec)."""

    device: str
    seq_length: Positive
    precision: str
    recompute: bool
    compile: bool
    settings: str = "published"
    cross_entropy: str = "standard"
    fused_qkv: bool = False
    data: str
    split: str
    valid_data: str | None = None
    eval_iters: Count
    steps: Positive
    warmup: Count
    seed: Count
    telemetry: bool
    fsdp: bool = False
    engine: str = "native"
    threads_per_rank: Positive | None = None
    save: str | None = None
    save_interval: Positive | None = None
    load: str | None = None
    async_save: bool = False
    profile: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeptOptimizerOptions:
    """The run options OptimizerSpec keeps (hwbench.spec)."""

    lr: float
    min_lr: float
    lr_warmup_init: float = 0.0
    lr_decay_iters: Positive
    lr_decay_style: str
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-08
    weight_decay: float
    clip_grad: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeptLaunchOptions:
    """The run options LaunchSpec keeps (hwbench.spec)."""

    nproc_per_node: Positive = 1
    nnodes: Positive = 1
    node_rank: Count = 0
    master_addr: str = "127.0.0.1"
    master_port: Positive | None = None
    rdzv_endpoint: str | None = None
    max_restarts: Count = 0
