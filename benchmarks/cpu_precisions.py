"""A square matmul's time in fp32, bf16 and fp16 on this CPU, one thread: how much slower torch's
emulation of a precision without matrix units is (the CPU backend's warning names the units it
looks for). Prints one line per size; figures go to docs/performance.md, 'CPU precisions'.

    python benchmarks/cpu_precisions.py [SIZE ...]      (default 256 512 1024)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from hwbench.cli import Parser  # argparse whose errors are one UsageError line
from hwbench.errors import UsageError

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def median_matmul_ms(size: int, dtype: torch.dtype, repeats: int = 5) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b  # the first call picks and loads the kernel
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def square_size(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 8192:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted; give a matrix size from 1 to 8192")
    return int(text)


def main() -> int:
    parser = Parser(prog="cpu_precisions", description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=square_size, default=[256, 512, 1024], metavar="SIZE",
                        help="square matmul sizes (default 256 512 1024)")
    try:
        args = parser.parse_args()
    except UsageError as error:  # the Parser's line already starts with "cpu_precisions:"
        print(error, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for size in args.sizes:
        ms = {name: median_matmul_ms(size, dtype) for name, dtype in PRECISIONS.items()}
        ratios = ", ".join(f"{name} {ms[name] / ms['fp32']:.2f}x fp32" for name in ("bf16", "fp16"))
        print(f"{size}x{size}: " + ", ".join(f"{name} {value:.2f} ms" for name, value in ms.items()) + f" ({ratios})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
