"""`hwbench accept`'s probes and flow: each device measured alone (device_probe), each node of a
Slurm partition probed at once (node_probes), then a suite against a baseline (accept; the
judgement is hwbench.judge.accept's)."""
