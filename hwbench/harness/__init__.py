"""Running benchmark points: the worker (one point in this process), its
measurement helpers and the progress display."""
