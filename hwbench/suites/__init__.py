"""Many benchmark points: a suite file's points (suite), the point loop (executor) with each point
a local process tree (sweep) or a Slurm job (slurm), and the search for the fastest settings (tune).
Each point itself is hwbench.harness's run of one point."""
