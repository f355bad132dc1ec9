"""GPT workloads: the Megatron GPT-2 model, its sizes, FLOPs and synthetic data."""

from hwbench.workload.config import GPTConfig
from hwbench.workload.flops import FLOPS_FORMULAS, model_flops_per_iteration
from hwbench.workload.params import count_parameters

__all__ = ["GPTConfig", "FLOPS_FORMULAS", "count_parameters", "model_flops_per_iteration"]
