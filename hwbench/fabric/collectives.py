"""What `hwbench collectives` measures, as nccl-tests measures it: the collectives, the message
sizes, and the bus-bandwidth factor of each (nccl-tests' doc/PERFORMANCE.md; docs/collectives.md).
Torch-free: the command checks its input with this before anything starts."""

from __future__ import annotations

import dataclasses

from hwbench.errors import UsageError
from hwbench.units import human_bytes


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective. ``size`` is nccl-tests' size: the bytes of the largest buffer a rank holds
    (all-gather's output, reduce-scatter's input). ``divides``: the size is cut to a multiple of
    the world size's elements (each rank's share is whole). ``in_place``: torch has an in-place
    form of it; ``out_of_place``: an out-of-place one. ``factor``: busbw / algbw of n ranks is
    times x (n - minus) / n (nccl-tests' doc/PERFORMANCE.md), its figure and its text made from it."""

    name: str
    divides: bool
    in_place: bool
    out_of_place: bool
    factor: tuple[int, int]  # (times, minus)

    def bus_factor(self, world_size: int) -> float:
        times, minus = self.factor
        return times * (world_size - minus) / world_size

    @property
    def bus_factor_text(self) -> str:
        """As docs/collectives.md writes it: '2(n-1)/n', '(n-1)/n', '1'."""
        times, minus = self.factor
        return f"{times if times != 1 else ''}(n-{minus})/n" if minus else str(times)


COLLECTIVES = {c.name: c for c in (
    # torch's all_reduce, all_to_all_single, broadcast and batched send/recv have one form each
    Collective("all_reduce", divides=False, in_place=True, out_of_place=False, factor=(2, 1)),
    Collective("all_gather", divides=True, in_place=True, out_of_place=True, factor=(1, 1)),
    Collective("reduce_scatter", divides=True, in_place=True, out_of_place=True, factor=(1, 1)),
    Collective("all_to_all", divides=True, in_place=False, out_of_place=True, factor=(1, 1)),
    Collective("broadcast", divides=False, in_place=True, out_of_place=False, factor=(1, 0)),
    Collective("send_recv", divides=False, in_place=False, out_of_place=True, factor=(1, 0)),
)}
NO_FORM = {  # why a collective has no figure in one of the two columns
    "all_reduce": "torch's all_reduce has no out-of-place form (it reduces into the buffer it is given)",
    "all_to_all": "torch's all_to_all_single has no in-place form",
    "broadcast": "torch's broadcast has no out-of-place form (it writes the buffer it is given)",
    "send_recv": "torch's send and recv have no in-place form (a rank sends one buffer and receives into another)",
}
ELEMENT_BYTES = 4  # float32, nccl-tests' default data type
DEFAULT_MIN_BYTES = 8
DEFAULT_MAX_BYTES = 64 * 2 ** 20
MIN_WORLD_SIZE = 2  # every collective here moves data between ranks: one rank measures a copy


@dataclasses.dataclass(frozen=True)
class CollectiveSettings:
    """What the ranks measure (rank 0 checks it, every rank reads it from the launcher)."""

    collectives: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    warmup: int
    iterations: int
    check: bool
    timeout_s: float

    def sizes(self) -> list[int]:
        """min_bytes, doubling, up to max_bytes (nccl-tests' -b/-e/-f 2)."""
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= 2
        return sizes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CollectiveSettings:
        return cls(**{**data, "collectives": tuple(data["collectives"])})


def parse_collectives(text: str) -> tuple[str, ...]:
    """'all_reduce,broadcast' or 'all' as collective names (a dash reads as an underscore)."""
    if text.strip() == "all":
        return tuple(COLLECTIVES)
    names = tuple(dict.fromkeys(part.strip().replace("-", "_") for part in text.split(",")))
    unknown = [name for name in names if name not in COLLECTIVES]
    if unknown or not names:
        raise UsageError(f"--collectives {text!r}: {', '.join(map(repr, unknown)) or 'nothing'} is not a collective; "
                         f"accepted: all, or comma-separated names of {', '.join(COLLECTIVES)}")
    return names


def check_message_bytes(size: object, option: str) -> None:
    """A message size of ``option``: whole bytes holding at least one float32 element."""
    if type(size) is not int:  # the Python API's value: text, a float, a bool (an int, and no size)
        raise UsageError(f"{option} {size!r} is not a size; accepted: whole bytes of at least {ELEMENT_BYTES} B, "
                         "e.g. 4096")
    if size < ELEMENT_BYTES:
        raise UsageError(f"{option} {human_bytes(size)} holds no float32 element; accepted: a size of at least "
                         f"{ELEMENT_BYTES} B, e.g. 4KiB")


def check_sizes(min_bytes: int, max_bytes: int, min_option: str, max_option: str) -> None:
    """The doubling sizes' range (``min_option`` to ``max_option``): the largest holds an element and
    is at least the smallest (a smallest below one element gives sizes that are left out, as nccl-tests')."""
    check_message_bytes(max_bytes, max_option)
    if type(min_bytes) is not int:  # below one element it is taken (its sizes left out), but it must be a size
        raise UsageError(f"{min_option} {min_bytes!r} is not a size; accepted: whole bytes, e.g. 4KiB")
    if max_bytes < min_bytes:
        raise UsageError(f"{max_option} {human_bytes(max_bytes)} is below {min_option} {human_bytes(min_bytes)}; "
                         f"accepted: a size at least {min_option}")


def check_world_size(world_size: int, option: str = "--nproc-per-node") -> None:
    if world_size < MIN_WORLD_SIZE:
        raise UsageError(f"{option} {world_size}: the collectives need at least {MIN_WORLD_SIZE} ranks (one rank "
                         f"moves no data between ranks); accepted: an integer >= {MIN_WORLD_SIZE}")


def message_elements(collective: Collective, size: int, world_size: int) -> int:
    """Elements of the size's buffer: whole elements, a multiple of the world size where each rank
    holds a share (nccl-tests rounds so too); 0 when the size holds none."""
    elements = size // ELEMENT_BYTES
    if collective.divides:
        elements -= elements % world_size
    return elements


# the largest --slow-threshold taken: a pair ten times its peers' median (one link of a ring of a
# shared CPU can read a few times slower from noise alone; a faulty NIC or link is slower by orders)
MAX_SLOW_THRESHOLD = 10.0


@dataclasses.dataclass(frozen=True)
class Scope:
    """Collectives measured again on subgroups of a multi-node run: ``intra_node`` on each node's
    ranks (every node's group at once, as a hierarchical collective's first stage runs them),
    ``inter_node`` on one rank per node (the network alone). ``groups``: the ranks of each group;
    ``unmeasured``: why the scope has no figures (then ``groups`` is empty)."""

    name: str
    groups: list[list[int]]
    unmeasured: str | None = None


def node_ranks(hosts: list[str]) -> list[list[int]]:
    """Each host's ranks (``hosts[rank]`` is its host name), the hosts in the order of their first rank."""
    nodes: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    return list(nodes.values())


def scopes(hosts: list[str]) -> list[Scope]:
    """The subgroups a run on these hosts is measured on as well: none on one host (every figure is
    intra-node there); on several, each node's ranks and one rank per node (its lowest)."""
    nodes = node_ranks(hosts)
    if len(nodes) < 2:
        return []
    counts = sorted({len(ranks) for ranks in nodes})
    if counts == [1]:
        intra = Scope("intra_node", [], "each node has one rank: no two ranks share a node")
    elif len(counts) > 1:  # one busbw factor per table needs one group size
        intra = Scope("intra_node", [], f"the nodes hold different numbers of ranks ({', '.join(map(str, counts))})")
    else:
        intra = Scope("intra_node", nodes)
    return [intra, Scope("inter_node", [[ranks[0] for ranks in nodes]])]
