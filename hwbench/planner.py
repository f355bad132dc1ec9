"""The memory planner (`hwbench plan`): the predicted peak device memory of each
rank for one benchmark point, from the architecture and the layout alone (no
torch, no device). docs/planner.md writes the model down with its sources.

In short, per rank of pipeline stage ``stage`` (P = parameters this rank holds
after tensor and pipeline parallelism, before data-parallel sharding):

    static  = weights + gradients + optimizer state + persistent buffers
    working = activations + logits + gathered (FSDP2 / ZeRO-3 unsharded units)
              + autocast's 16-bit weight copies (native engine, bf16/fp16)
    total   = static + overhead + max(working, step_transient)

``step_transient`` is what exists only after the backward (the flat gradient
all-reduce buffer, foreach AdamW temporaries, DeepSpeed's fp32 gradient copy),
when the activations are already freed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hwbench.device.kinds import DEVICE_KINDS, KINDS
from hwbench.errors import UsageError
from hwbench.spec import ENGINES, RunSpec
from hwbench.units import GIB, parse_size  # noqa: F401  (parse_size: planner.parse_size, as before)
from hwbench.workload.config import CROSS_ENTROPY_CHUNK_TOKENS, GPTConfig, stage_layers

# Fixed per-device framework memory outside the tensors counted here: the device
# kind's estimate (hwbench/device/kinds.py; docs/planner.md).
OVERHEAD_BYTES = {name: kind.framework_overhead_bytes for name, kind in KINDS.items()}

# A plan fits when its total is at most this fraction of the device's memory: the
# caching allocator's fragmentation (reserved above allocated, commonly 5-15 %)
# and the temporaries not modelled need the rest.
DEFAULT_HEADROOM = 0.9

# DeepSpeed's default ZeRO-1/2 gradient bucket (reduce_bucket_size, elements); the
# engine (hwbench/engine/deepspeed.py) does not change it.
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000

FP32 = 4
HALF = 2


@dataclasses.dataclass(frozen=True)
class StageParams:
    """Parameters one rank of a pipeline stage holds, after tensor parallelism and
    before any data-parallel sharding."""

    blocks: int  # parameters of this stage's transformer blocks (this TP rank's share)
    block: int  # one block's parameters (this TP rank's share)
    embedding: int  # word (V*h/t) + position (P*h) embeddings: the first stage
    head: int  # final LayerNorm, plus the output layer's own weight copy when pp > 1: the last stage
    layers: int  # blocks on this stage
    # what this stage's linear layers read (their weights and biases, and the output layer's
    # weight on the last stage): the parameters autocast casts to 16 bits
    linear: int = 0

    @property
    def total(self) -> int:
        return self.blocks + self.embedding + self.head


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Predicted peak memory of one rank (bytes), for pipeline stage ``stage``.
    total = weights + gradients + optimizer + buffers + overhead
            + max(activations + logits + gathered + cast_weights, step_transient)."""

    stage: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    buffers_bytes: int  # persistent communication buffers (DDP buckets, DeepSpeed's reduce bucket)
    activations_bytes: int  # everything kept for the backward, all micro-batches in flight on this stage
    logits_bytes: int  # last stage only
    gathered_bytes: int  # FSDP2 / ZeRO-3 unsharded parameters (and one unit's gradients) while computing
    cast_weights_bytes: int  # autocast's 16-bit copies of the linear layers' parameters, alive to the forward's end
    step_transient_bytes: int  # after the backward, when activations are freed
    overhead_bytes: int
    total_bytes: int
    parameters: int  # parameters this rank holds before dp sharding (tp and pp applied)
    microbatches_in_flight: int
    notes: tuple[str, ...] = ()

    def fits(self, capacity_bytes: int, headroom: float = DEFAULT_HEADROOM) -> bool:
        return fits(self, capacity_bytes, headroom)


def fits(plan: MemoryPlan, capacity_bytes: int, headroom: float = DEFAULT_HEADROOM) -> bool:
    """True when the predicted peak is at most ``headroom`` x the device's memory."""
    return plan.total_bytes <= headroom * capacity_bytes


def stage_parameters(config: GPTConfig, tp: int, pp: int, stage: int) -> StageParams:
    """Exact per-rank parameter counts (hwbench/engine/parallelize.py's split).

    Per block, one TP rank: q, k, v, fc1 column-parallel (weights and biases / t),
    out_proj and fc2 row-parallel (weights / t, biases replicated), both LayerNorms
    replicated: (3h^2 + 3h + h^2 + 4h^2 + 4h + 4h^2) / t + (h + h + 4h)
    = (12h^2 + 7h) / t + 6h   (t = 1: 12h^2 + 13h, as params.count_parameters).
    The word embedding and the output layer are vocab-parallel (V/t rows).
    Linear layers' parameters: the block less its two LayerNorms (4h), and the output
    layer's weight (V/t rows; at pp = 1 it is the word embedding's)."""

    h = config.hidden_size
    vocab = config.padded_vocab_size(tp)
    block = (12 * h * h + 7 * h) // tp + 6 * h
    layers = len(stage_layers(config.num_layers, pp, stage))
    embedding = vocab * h // tp + config.max_position_embeddings * h if stage == 0 else 0
    head = 0
    output = 0
    if stage == pp - 1:
        output = vocab * h // tp
        head = 2 * h + (output if pp > 1 else 0)  # pp = 1: the output weight is wte itself
    linear = layers * (block - 4 * h) + output
    return StageParams(blocks=layers * block, block=block, embedding=embedding, head=head, layers=layers,
                       linear=linear)


def activation_bytes_per_layer(s: int, b: int, h: int, tp: int, act: int, residual: int,
                               qkv_input_copies: int = 1) -> int:
    """Bytes one block keeps for its backward (Korthikanti et al. 2022, Table 2 /
    eq. 2 without sequence parallelism), for hwbench's block: SDPA fused attention
    keeps no (a, s, s) scores, so the 5as/h term is gone; no dropout, so the two
    s*b*h dropout masks are gone. ``act``: bytes of the autocast dtype, ``residual``:
    bytes of the residual stream (fp32 under hwbench's autocast, fp32 weights).
    ``qkv_input_copies``: how many copies of the first LayerNorm's output the attention's
    input projections keep (``qkv_input_copies``, below).

    replicated: two LayerNorm inputs 2*residual*sbh, the q/k/v input (qkv_input_copies
    copies) and fc1 input (the autocast copies of the LayerNorm outputs) act*sbh each;
    per TP rank: q, k 2*act, v act, out_proj input act, GELU input 4*act,
    fc2 input 4*act = 12*act*sbh / t.
    act = residual = 2, one copy: s*b*h*(8 + 24/t), the paper's 10 + 24/t less the masks."""
    sbh = s * b * h
    return sbh * (2 * residual + (qkv_input_copies + 1) * act) + sbh * 12 * act // tp


def qkv_input_copies(spec: RunSpec) -> int:
    """Copies of the first LayerNorm's output that a block keeps for its q/k/v projections'
    backward. Autocast caches the 16-bit casts of leaf tensors (parameters) only, so with
    separate q_proj, k_proj and v_proj each casts the fp32 LayerNorm output again and keeps
    its own copy: 3 (measured on the model, tests/test_planner.py). One fused projection, or a
    run without autocast (fp32; DeepSpeed's 16-bit module), reads one tensor: 1."""
    autocast = spec.precision != "fp32" and spec.engine != "deepspeed"
    return 3 if autocast and not spec.fused_qkv else 1


def _dtype_bytes(spec: RunSpec) -> tuple[int, int, int, int]:
    """(weight, gradient, activation, residual-stream) bytes for the engine and precision."""
    if spec.precision == "fp32":
        return FP32, FP32, FP32, FP32
    if spec.engine == "deepspeed":  # DeepSpeed converts the module to fp16/bf16
        return HALF, HALF, HALF, HALF
    return FP32, FP32, HALF, FP32  # autocast over fp32 weights: the residual stream stays fp32


def microbatches_in_flight(spec: RunSpec, stage: int) -> int:
    """Micro-batches whose activations a stage holds at once: 1 without pipelining
    (accumulation runs forward then backward per micro-batch); 1F1B: pp - stage
    (at most all of them); GPipe: all of them."""
    m = spec.gradient_accumulation_steps
    if spec.parallel.pp == 1:
        return 1
    if spec.pp_schedule == "gpipe":
        return m
    return min(spec.parallel.pp - stage, m)


def plan_stage(spec: RunSpec, config: GPTConfig, backend_name: str, stage: int) -> MemoryPlan:
    """The predicted peak of a rank of pipeline stage ``stage``. ``config`` is the
    workload's shape; the spec's --max-positions is applied to it here."""
    config = spec.model_config(config)
    if backend_name not in OVERHEAD_BYTES:
        raise UsageError(f"--device {backend_name!r} is not known; accepted: {', '.join(DEVICE_KINDS)}")
    tp, pp, dp = spec.parallel.tp, spec.parallel.pp, spec.parallel.dp
    params = stage_parameters(config, tp, pp, stage)
    n = params.total
    w_b, g_b, act_b, res_b = _dtype_bytes(spec)
    notes: list[str] = []
    deepspeed = spec.engine == "deepspeed"
    half = spec.precision != "fp32"
    zero = spec.zero_stage if deepspeed and dp > 1 else 0

    # states ------------------------------------------------------------------
    if deepspeed and half:
        # ZeRO paper: 2 (fp16 weights) + 2 (fp16 grads) + K = 12 (fp32 master, m, v) bytes/param
        opt_per_param = 3 * FP32
        notes.append("deepspeed 16-bit: 2+2+12 bytes/param (ZeRO paper, K=12)")
    else:
        opt_per_param = 2 * FP32  # AdamW: two fp32 moments
    weights = n * w_b
    gradients = n * g_b
    optimizer = n * opt_per_param
    sharded = spec.fsdp and dp > 1
    if sharded:  # FSDP2: everything sharded over dp (padding to a multiple of dp ignored)
        weights, gradients, optimizer = _ceil(weights, dp), _ceil(gradients, dp), _ceil(optimizer, dp)
    if zero >= 1:
        optimizer = _ceil(optimizer, dp)
    if zero >= 2:
        gradients = _ceil(gradients, dp)
    if zero >= 3:
        weights = _ceil(weights, dp)

    buffers = 0
    step_transient = 0
    if not deepspeed and dp > 1 and not spec.fsdp:
        if tp == 1 and pp == 1:
            buffers = n * g_b  # DDP's gradient buckets: a second copy (gradient_as_bucket_view=False)
            notes.append("DDP buckets: one more gradient copy")
        else:
            step_transient = n * g_b  # native engine: one flat all-reduce buffer of the gradients
    if deepspeed and dp > 1 and zero in (1, 2):
        buffers = min(n, DEEPSPEED_REDUCE_BUCKET_ELEMENTS) * g_b
    if deepspeed and half:  # the fp32 gradients of (this partition of) the master weights at the step
        step_transient = max(step_transient, _ceil(n * FP32, dp if zero >= 1 else 1))
    if not deepspeed and not KINDS[backend_name].fused_adamw:
        # foreach AdamW (no fused kernel): sqrt(v) temporaries the size of the local parameters
        local = _ceil(n, dp) if sharded else n
        step_transient = max(step_transient, local * FP32)
        notes.append(f"{backend_name}: foreach AdamW temporaries at the step")

    # activations ---------------------------------------------------------------
    s, b, h = spec.seq_length, spec.micro_batch_size, config.hidden_size
    in_flight = microbatches_in_flight(spec, stage)
    full_layer = activation_bytes_per_layer(s, b, h, tp, act_b, res_b, qkv_input_copies(spec))
    if spec.recompute:
        per_micro = params.layers * s * b * h * res_b  # each block's input only
        recompute_peak = full_layer if params.layers else 0  # one block's activations while it is recomputed
        notes.append("recompute: block inputs kept, one block recomputed at a time")
    else:
        per_micro = params.layers * full_layer
        recompute_peak = 0
    last = stage == pp - 1
    if last:
        per_micro += s * b * h * (res_b + act_b)  # final LayerNorm input and the output layer's input
    activations = in_flight * per_micro + recompute_peak

    # Autocast casts each fp32 parameter a linear layer reads to 16 bits once and keeps the copy in
    # its cache until the autocast region ends, after the loss; without recompute the backward keeps
    # the weights' copies until each layer's own backward too. So at the end of the forward every
    # copy is alive, even under FSDP2, whose unsharded parameters are what autocast casts: the copies
    # of every block stay after the block is resharded. DeepSpeed holds 16-bit weights: no casts.
    cast_weights = params.linear * HALF if half and not deepspeed else 0
    if cast_weights:
        notes.append("autocast: 16-bit copies of the linear layers' parameters, 2 bytes/param, to the forward's end")

    logits = 0
    if last:
        loss_parallel = tp > 1 and pp == 1  # hwbench/engine/native.py: else the logits are gathered
        vocab = config.padded_vocab_size(tp) // (tp if loss_parallel else 1)
        if spec.cross_entropy == "chunked":
            # per micro-batch in flight: each token's fp32 log-sum-exp; at a time, one chunk's logits
            # in the activation dtype, its fp32 copy and one fp32 temporary (the exp in the forward,
            # the gradient in the backward)
            chunk = min(CROSS_ENTROPY_CHUNK_TOKENS, s * b)
            logits = in_flight * s * b * FP32 + chunk * vocab * (act_b + 2 * FP32)
            notes.append(f"chunked cross-entropy: {chunk} tokens' logits at a time")
        else:
            sv = s * b * vocab
            # per micro-batch in flight: the fp32 log-softmax kept for the loss's backward; during
            # one backward: the logits in the activation dtype and the fp32 gradient
            logits = in_flight * sv * FP32 + sv * (act_b + FP32)
        if tp > 1 and not loss_parallel:
            notes.append("tp with pp: logits gathered over the full vocabulary on the last stage")

    gathered = 0
    if sharded:
        # FSDP2 units: every block, and the root (embeddings, final LayerNorm, output).
        # The root stays gathered from its forward to its backward (FSDP2 never
        # reshards the root after forward); blocks: the one computing and the one
        # prefetched, or all of the stage's when pp > 1 (reshard_after_forward=False);
        # plus one block's unsharded gradients before their reduce-scatter.
        kept_blocks = 2 if pp == 1 else params.layers
        root = params.embedding + params.head
        gathered = (root + min(kept_blocks, params.layers) * params.block) * w_b + params.block * g_b
    elif zero >= 3:
        # ZeRO-3 gathers module by module with a prefetch: about two blocks, or the word embedding
        gathered = max(params.embedding + params.head, 2 * params.block) * w_b + params.block * g_b
        notes.append("zero-3 gathered units approximated as max(embedding, two blocks)")

    overhead = OVERHEAD_BYTES[backend_name]
    static = weights + gradients + optimizer + buffers
    total = static + overhead + max(activations + logits + gathered + cast_weights, step_transient)
    return MemoryPlan(stage=stage, weights_bytes=weights, gradients_bytes=gradients, optimizer_bytes=optimizer,
                      buffers_bytes=buffers, activations_bytes=activations, logits_bytes=logits,
                      gathered_bytes=gathered, cast_weights_bytes=cast_weights, step_transient_bytes=step_transient,
                      overhead_bytes=overhead,
                      total_bytes=total, parameters=n, microbatches_in_flight=in_flight, notes=tuple(notes))


def plan_for_all_stages(spec: RunSpec, config: GPTConfig, backend_name: str) -> list[MemoryPlan]:
    """Every pipeline stage's plan (``config`` as in plan_stage)."""
    return [plan_stage(spec, config, backend_name, stage) for stage in range(spec.parallel.pp)]


def plan_memory(spec: RunSpec, config: GPTConfig, backend_name: str) -> MemoryPlan:
    """The plan of the rank with the largest predicted peak (its ``stage`` says
    which pipeline stage; the first stage wins ties). ``config`` is the workload's
    shape, as in plan_stage."""
    plans = plan_for_all_stages(spec, config, backend_name)
    return max(plans, key=lambda plan: (plan.total_bytes, -plan.stage))


def _ceil(value: int, divisor: int) -> int:
    return -(-value // divisor)


# sizes ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Variant:
    """How a layout's data parallelism is run: the native engine plain or with FSDP2,
    or DeepSpeed with a ZeRO stage. `hwbench plan` and `hwbench tune` share these."""

    engine: str
    fsdp: bool = False
    zero: int = 0

    @property
    def name(self) -> str:
        return "native fsdp" if self.fsdp else "native" if self.engine == "native" else f"deepspeed zero{self.zero}"

    @property
    def short(self) -> str:
        return "fsdp" if self.fsdp else "plain" if self.engine == "native" else f"zero{self.zero}"

    def options(self) -> dict:
        """The run options that select this variant."""
        return {"engine": self.engine, "fsdp": self.fsdp or None,
                "zero": self.zero if self.engine == "deepspeed" else None}


def variants(tp: int, pp: int, dp: int, engines: Sequence[str] = ENGINES) -> list[Variant]:
    """The variants a tp x pp x dp layout can run: native plain, FSDP2 when there is
    data parallelism to shard over, DeepSpeed ZeRO 0-3 (0 only without data
    parallelism) for pure data parallelism."""
    found = []
    if "native" in engines:
        found.append(Variant("native"))
        if dp > 1:
            found.append(Variant("native", fsdp=True))
    if "deepspeed" in engines and tp == 1 and pp == 1:
        found += [Variant("deepspeed", zero=zero) for zero in range(4 if dp > 1 else 1)]
    return found


def layouts(devices: int) -> list[tuple[int, int, int]]:
    """Every (tp, pp, dp) split of ``devices``, tp-major."""
    return [(tp, pp, devices // (tp * pp)) for tp in range(1, devices + 1) for pp in range(1, devices + 1)
            if devices % (tp * pp) == 0]
