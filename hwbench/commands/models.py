"""`hwbench models`: the workload catalog with parameter counts and published settings."""

from __future__ import annotations

import argparse

DESCRIPTION = "List the workloads with their parameter counts and published settings."


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from hwbench.catalog import load_catalog
    from hwbench.workload.params import count_parameters

    rows = []
    for workload in sorted(load_catalog().workloads.values(), key=lambda w: count_parameters(w.model).total):
        m, t, p = workload.model, workload.training, workload.published
        counts = count_parameters(m)
        rows.append([
            workload.name, m.architecture, f"{counts.total:,}", f"{counts.active:,}" if m.moe else "-",
            f"{counts.non_embedding:,}", f"{m.num_experts} top-{m.moe_router_topk}" if m.moe else "-",
            m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, f"{m.vocab_size:,}", t.seq_length,
            f"{t.micro_batch_size}/{t.global_batch_size}", t.precision, "yes" if t.recompute else "no",
            f"{p.devices} dev, TP{p.tp} PP{p.pp} ({', '.join(p.tables)})" if p else "-",
        ])
    print(tabulate(rows, headers=["model", "architecture", "params", "active", "non-emb", "experts", "layers", "hidden",
                                  "heads",
                                  "kv heads", "vocab", "seq", "micro/global", "precision", "recompute",
                                  "published layout"],
                   disable_numparse=True))
    print("\nParameters are counted from the architecture over each model's vocabulary padded as Megatron pads it "
          "at TP1 (GPT-2's 50,257 to 50,304; Llama 3's 128,256 stays), no weights allocated. A mixture of experts' "
          "active parameters are what one token passes through: all but the routed experts it is not sent to.")
    return 0
