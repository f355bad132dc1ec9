"""Made the fixture result files of tests/test_report.py, once, from a real run
(`python -m hwbench run --quiet --model tiny --steps 4 --warmup 1 --eval-iters 1`,
kept as source-tiny-cpu.json) with hand-set figures so that the tests can check
ratios, costs and energy by hand. Run from the repository root:
    python tests/data/report/make_fixtures.py
"""

import copy
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = 2 ** 30


def write(folder: str, name: str, data: dict) -> None:
    (HERE / folder).mkdir(exist_ok=True)
    (HERE / folder / name).write_text(json.dumps(data, indent=2) + "\n")


def accelerator(base: dict, run_id: str, model: str, tp: int, pp: int, dp: int, samples_per_s: float,
                device: dict, environment: dict, seq: int = 1024, micro: int = 4, global_batch: int = 16,
                precision: str = "fp16") -> dict:
    data = copy.deepcopy(base)
    world = tp * pp * dp
    data["run_id"] = run_id
    data["spec"].update(model=model, seq_length=seq, micro_batch_size=micro, global_batch_size=global_batch,
                        precision=precision, parallel={"tp": tp, "pp": pp, "dp": dp, "source": "user"},
                        device=device["backend"])
    data["spec"]["launch"]["nproc_per_node"] = world
    data["workload"].update(name=model, parameters=354_871_296)
    data["device"].update(device)
    data["device"]["device_count"] = world
    m = data["metrics"]
    m.update(samples_per_s=samples_per_s, tokens_per_s=samples_per_s * seq,
             tokens_per_s_per_device=samples_per_s * seq / world, world_size=world, mfu=0.25,
             tflops_per_device=123.4)
    m["unmeasured"].pop("mfu", None)
    m["memory"].update(peak_allocated_bytes=20 * GIB, peak_reserved_bytes=22 * GIB,
                       capacity_bytes=device.get("memory_capacity_bytes"), source="memory_stats")
    m["valid_ppl"], m["valid_ppl_step"] = 30.5, 5
    data["environment"].update(environment)
    data["nodes"] = []
    return data


def main() -> None:
    base = json.loads((HERE / "source-tiny-cpu.json").read_text())
    base["steps"] = base["steps"][:5]
    h100 = {"backend": "cuda", "dist_backend": "nccl", "device_model": "NVIDIA H100 80GB HBM3",
            "torch_device": "cuda", "simulated": False, "catalog_entry": "h100-sxm",
            "memory_capacity_bytes": 80 * GIB, "price_usd_per_hour": None}
    cuda_env = {"backend": "cuda", "torch_version": "2.13.0+cu128", "driver_version": "580.65.06",
                "cuda_version": "12.8", "device_models": ["NVIDIA H100 80GB HBM3"]}
    # a: 345m, TP1 PP2 DP1 on 2 H100s, 14.925 samples/s (= a quarter of the published 8p-NPU 59.7,
    # the same per device); telemetry: 2 devices x 1000 J, 400 W each
    a = accelerator(base, "20261121T100000Z-345m-cuda-aaaaaa", "345m", 1, 2, 1, 14.925, h100,
                    dict(cuda_env, device_count=2))
    a["metrics"]["telemetry"] = {
        "source": "nvml", "available": True, "interval_s": 0.5, "window_s": 4.4, "samples": 10, "errors": [],
        "ranks": 2, "ranks_available": 2, "energy_j": 2000.0, "power_w_mean_total": 800.0,
        "devices": [{"index": i, "power_w_mean": 400.0, "power_w_max": 450.0, "energy_j": 1000.0,
                     "energy_method": "energy counter", "unmeasured": {}} for i in range(2)]}
    a["metrics"]["unmeasured"].pop("telemetry", None)
    write("good", "a-345m-h100x2.json", a)
    # d: 345m, TP1 PP1 DP1 on 1 H100, 8 samples/s (a second world size: the scaling plot)
    d = accelerator(base, "20261121T110000Z-345m-cuda-dddddd", "345m", 1, 1, 1, 8.0, h100,
                    dict(cuda_env, device_count=1))
    d["metrics"]["telemetry"] = {"source": "nvml", "available": False, "devices": [],
                                 "reason": "nvidia-ml-py (module pynvml) is not installed"}
    d["metrics"]["unmeasured"]["telemetry"] = "nvidia-ml-py (module pynvml) is not installed"
    write("good", "d-345m-h100x1.json", d)
    # c: 345m-nomp on 1 simulated Ascend NPU, 14.1875 samples/s (Table 3 8p-NPU: 227 / 8 = 28.375 per device)
    npu = {"backend": "npu", "dist_backend": "hccl", "device_model": "Ascend910B2", "torch_device": "npu",
           "simulated": True, "catalog_entry": "ascend-910b", "memory_capacity_bytes": 64 * GIB,
           "price_usd_per_hour": None}
    c = accelerator(base, "20261121T120000Z-345m-nomp-npu-cccccc", "345m-nomp", 1, 1, 1, 14.1875, npu,
                    {"backend": "npu", "simulated": True, "torch_version": "2.12.0", "cann_version": "8.0.RC3",
                     "driver_version": "24.1.rc2", "device_count": 1}, micro=8, global_batch=64)
    c["metrics"]["mfu"] = None
    c["metrics"]["unmeasured"]["mfu"] = "the device is simulated"
    c["metrics"]["telemetry"] = {"source": "npu-smi", "available": False, "devices": [],
                                 "reason": "npu-smi is not on PATH"}
    c["metrics"]["unmeasured"]["telemetry"] = "npu-smi is not on PATH"
    write("good", "c-345m-nomp-npu-sim.json", c)
    # b: the tiny CPU run, 4 samples/s x 128 tokens = 512 tokens/s, priced 0.36 USD/h in the result
    b = copy.deepcopy(base)
    b["run_id"] = "20261121T130000Z-tiny-cpu-bbbbbb"
    b["device"]["price_usd_per_hour"] = 0.36
    b["metrics"].update(samples_per_s=4.0, tokens_per_s=512.0, tokens_per_s_per_device=512.0)
    b["nodes"] = []
    write("good", "b-tiny-cpu.json", b)
    # e: an out-of-memory run: listed, never compared
    e = accelerator(base, "20261121T140000Z-1.3b-cuda-eeeeee", "1.3b", 2, 2, 2, 1.0, h100,
                    dict(cuda_env, device_count=8))
    e.update(status="oom", metrics={}, steps=[], ranks=[],
             error={"type": "OutOfMemoryError", "message": "CUDA out of memory", "traceback": ""})
    write("good", "e-1.3b-oom.json", e)
    # f (own folder, llama/): llama3.1-8b on 8 H100s, FSDP, bf16, seq 8192, micro 2, global 16 (torchtitan's
    # Table 1 settings), 5,000 tokens/s per device (40,000 / 8): read against the published Llama tables
    f = accelerator(base, "20261129T100000Z-llama3.1-8b-cuda-ffffff", "llama3.1-8b", 1, 1, 8, 40_000 / 8192, h100,
                    dict(cuda_env, device_count=8), seq=8192, micro=2, global_batch=16, precision="bf16")
    f["spec"]["fsdp"] = True
    f["workload"].update(parameters=8_030_261_248)
    f["metrics"]["tflops_per_device"] = 250.0
    f["metrics"]["telemetry"] = d["metrics"]["telemetry"]
    f["metrics"]["unmeasured"]["telemetry"] = d["metrics"]["unmeasured"]["telemetry"]
    write("llama", "f-llama3.1-8b-h100x8.json", f)
    # bad: one good file, one truncated, one of an unknown schema version
    write("bad", "b-tiny-cpu.json", b)
    text = json.dumps(b, indent=2)
    (HERE / "bad" / "truncated.json").write_text(text[: len(text) // 2])
    write("bad", "future.json", dict(b, schema_version=99, run_id="20261121T150000Z-tiny-cpu-ffffff"))


if __name__ == "__main__":
    main()
