"""The process group and device mesh of one run, and this rank's place in it.

Ranks are laid out as Megatron lays them out: tensor parallelism innermost
(neighbouring ranks, on one node, over the fastest links), then data
parallelism, pipeline stages outermost. One DeviceMesh with the named
dimensions ("pp", "dp", "tp") carries every group the engines use.

With expert parallelism (ep > 1) the data-parallel dimension is two: ("pp",
"edp", "ep", "tp"), ep innermost (the ep ranks that exchange tokens are
neighbours, as in Megatron-LM and torchtitan), and "dp" is their flattening, so
every "dp" group and coordinate is the one a run without ep has. "ep" groups hold
the experts once between them; "edp" groups (Megatron's expert-data-parallel)
join the ranks that hold the same experts.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from hwbench.device import Backend
from hwbench.spec import ParallelDims


@dataclasses.dataclass(frozen=True)
class RankEnvironment:
    """What torchrun (or a Kubernetes operator running torchrun) tells a worker."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str | None
    master_port: str | None
    run_id: str | None
    restart_count: int = 0  # torchrun's restarts of this job so far (--max-restarts)
    agent_store: bool = False  # the TCPStore at master_addr:master_port is torchrun's agent's

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> RankEnvironment | None:
        """The rank environment when this process was started by torchrun, else None.
        A pod that only has RANK and WORLD_SIZE (as the PyTorchJob operator sets
        them per pod) is not a torchrun worker: it has no LOCAL_RANK."""
        env = os.environ if environ is None else environ
        if "TORCHELASTIC_RUN_ID" not in env and "LOCAL_RANK" not in env:
            return None
        if not all(key in env for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
            return None
        return cls(
            rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), local_rank=int(env["LOCAL_RANK"]),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")), node_rank=int(env.get("GROUP_RANK", "0")),
            master_addr=env.get("MASTER_ADDR"), master_port=env.get("MASTER_PORT"),
            run_id=env.get("TORCHELASTIC_RUN_ID"),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True),
        )


@dataclasses.dataclass
class DistContext:
    """This rank's coordinates. With one process there is no process group and
    every group is None; the collectives below then do nothing."""

    dims: ParallelDims
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    mesh: Any = None  # torch.distributed.device_mesh.DeviceMesh over ("pp", "dp", "tp"), or with ep (module doc)
    flattened: dict[str, Any] = dataclasses.field(default_factory=dict)  # "dp" with ep > 1: of ("edp", "ep")

    @property
    def distributed(self) -> bool:
        return self.mesh is not None

    def submesh(self, name: str):
        """The 1-D mesh of dimension ``name`` ("pp", "dp", "tp"; "ep", "edp" with ep > 1)."""
        return self.flattened[name] if name in self.flattened else self.mesh[name]

    def _coordinate(self, name: str) -> int:
        return self.submesh(name).get_local_rank() if self.mesh is not None else 0

    def group(self, name: str):
        """The process group of mesh dimension ``name`` ("pp", "dp", "tp"; "ep", "edp" with ep > 1)."""
        return self.submesh(name).get_group() if self.mesh is not None else None

    @property
    def tp_rank(self) -> int:
        return self._coordinate("tp")

    @property
    def pp_rank(self) -> int:
        return self._coordinate("pp")

    @property
    def dp_rank(self) -> int:
        return self._coordinate("dp")

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.dims.pp - 1

    def all_reduce(self, tensor: torch.Tensor, dim: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """In-place all-reduce over one mesh dimension (nothing when it has size 1)."""
        if self.mesh is not None and self.submesh(dim).size() > 1:
            dist.all_reduce(tensor, op=op, group=self.group(dim))
        return tensor

    def all_reduce_world(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over every rank, in place."""
        if self.mesh is not None:
            dist.all_reduce(tensor)
        return tensor

    def gather_objects(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (a list in rank order); None on other ranks.
        With one process, [value]."""
        if self.mesh is None:
            return [value]
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a name every rank must agree on)."""
        if self.mesh is None:
            return value
        held = [value]
        dist.broadcast_object_list(held, src=0)
        return held[0]

    def barrier(self) -> None:
        if self.mesh is not None:
            dist.barrier()


def single_process(dims: ParallelDims) -> DistContext:
    return DistContext(dims=dims)


def init_distributed(backend: Backend, dims: ParallelDims, env: RankEnvironment,
                     timeout_s: float) -> DistContext:
    """Join the process group torchrun set up (env:// rendezvous) on the device's
    collective backend (gloo, nccl, hccl) and build the ("pp", "dp", "tp") mesh (``device_mesh``)."""
    if dims.world_size != env.world_size:
        raise ValueError(f"tp x pp x dp = {dims.world_size} but torchrun started {env.world_size} ranks")
    options: dict[str, Any] = {"backend": backend.dist_backend,
                               "timeout": datetime.timedelta(seconds=timeout_s)}
    if backend.torch_device.type != "cpu":
        options["device_id"] = backend.torch_device
    if env.restart_count > 0 and env.agent_store and env.master_addr and env.master_port:
        # torchrun's static rendezvous keeps its agent's store across restarts, and env:// adds no
        # prefix per attempt: the failed attempt's keys (a dead rank's address) would be read by
        # this one. The attempt's own prefix keeps them apart.
        store = dist.TCPStore(env.master_addr, int(env.master_port), env.world_size, is_master=False,
                              timeout=options["timeout"])
        options.update(store=dist.PrefixStore(f"hwbench/attempt_{env.restart_count}", store), rank=env.rank,
                       world_size=env.world_size)
    dist.init_process_group(**options)
    mesh, flattened = device_mesh(backend.torch_device.type, dims)
    return DistContext(dims=dims, rank=env.rank, world_size=env.world_size, local_rank=env.local_rank,
                       local_world_size=env.local_world_size, node_rank=env.node_rank, mesh=mesh,
                       flattened=flattened)


def device_mesh(device_type: str, dims: ParallelDims) -> tuple[Any, dict[str, Any]]:
    """The run's DeviceMesh, ("pp", "dp", "tp"), and its flattened dimensions: with ep > 1 the
    mesh is ("pp", "edp", "ep", "tp") and "dp" the flattening of ("edp", "ep"), the same group
    as without ep (torch's way to merge dimensions; torchtitan's dp_shard, too)."""
    from torch.distributed.device_mesh import init_device_mesh

    if dims.ep == 1:
        return init_device_mesh(device_type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=("pp", "dp", "tp")), {}
    mesh = init_device_mesh(device_type, (dims.pp, dims.expert_dp, dims.ep, dims.tp),
                            mesh_dim_names=("pp", "edp", "ep", "tp"))
    return mesh, {"dp": mesh["edp", "ep"]._flatten("dp")}


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
