"""The per-rank binding plan: GPU, CPUs, memory node and NIC for each local
rank of a step on one node. Pure; inputs from :mod:`gsrun.bind.plan.env`,
effects in :mod:`gsrun.bind.plan.apply`. Field cases: docs/field-cases.md.

1. **GPUs.** ``SLURM_STEP_GPUS`` (else ``SLURM_JOB_GPUS``) are gres indices =
   ``/dev/nvidiaN`` minors (case 8), matched by minor, then UUID;
   ``CUDA_VISIBLE_DEVICES`` gives the task's names (cgroup-local ordinals,
   case 9; UUIDs; MIG UUIDs, case 11). A GPU the host does not show stays
   with its index only ("unknown/emulated").
2. **Ranks to GPUs.** ``n`` ranks, ``g`` GPUs: rank ``r`` owns GPU ``r % g``
   when ``n >= g``, else GPUs ``{i : i % n == r}``.
3. **CPUs.** A rank's pool is its GPU's NUMA node ∩ the allowed CPUs. A node
   with no allowed CPU (case 3) sends its ranks to the nearest node that has
   some; extra ranks spill to the nearest node with spare CPUs; a CPU-less
   node is never a pool. A GPU with no NUMA locality (affinity spanning
   nodes) shares the free CPUs of its affinity among its ranks, with no
   memory binding; other unknown-node ranks take the node with the most
   allowed CPUs per rank. A pool is split into contiguous, disjoint,
   near-equal slices by whole cores, else by threads, else round-robin; a
   rank never gets an empty set or a CPU outside the allowed set.
4. **Memory.** The nodes of the rank's CPUs (``[]`` when unknown); a
   memory-less node is replaced by the nearest node with memory.
5. **NIC.** InfiniBand/RoCE first, then NUMA distance, PCI closeness to the
   GPU, fewest ranks; ``None`` when no NIC has a known node.

NCCL intersects a GPU's ideal mask with the process's (case 3,
nccl-tests#57); each rank's mask is already its GPU's node ∩ the cpuset, so
``NCCL_IGNORE_CPU_AFFINITY`` is not set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gsrun.base.cpulist import format_cpulist
from gsrun.base.errors import InputError, TopologyError
from gsrun.facts.devices import DeviceToken
from gsrun.facts.topology import Gpu, Nic, Topology


#: Most local ranks of one node's plan (or one per online CPU if more): the plan
#: is computed as root from user values. Slurm's ``MaxTasksPerNode`` defaults to 512.
MAX_LOCAL_RANKS = 4096

#: other vendors' variables Slurm may set on an NVIDIA node (field case 11); unset
FOREIGN_GPU_VARS = ("ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK")


@dataclass(frozen=True, slots=True)
class GpuRef:
    """A step GPU: ``index`` the gres index (None: given by UUID, not found),
    ``cuda_name`` its ``CUDA_VISIBLE_DEVICES`` entry in the task, ``gpu`` the
    host fact (None = unknown/emulated)."""

    index: int | None
    uuid: str | None
    pci_bus_id: str | None
    cuda_name: str
    gpu: Gpu | None = field(default=None, compare=False)

    def label(self) -> str:
        if self.index is not None:
            return str(self.index)
        return self.uuid or self.cuda_name

    def to_json(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id}


@dataclass(frozen=True, slots=True)
class RankPlan:
    """One local rank's binding: ``cpus`` sorted, never empty; ``numa_node``
    None = unknown; ``env`` to set, ``unset`` to remove; ``warnings`` also in ``reason``."""

    local_rank: int
    gpu: GpuRef | None
    gpus: tuple[GpuRef, ...]
    numa_node: int | None
    cpus: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    nic: Nic | None
    env: dict[str, str]
    unset: tuple[str, ...]
    reason: str
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"local_rank": self.local_rank,
                "gpu": self.gpu.to_json() if self.gpu else None,
                "numa_node": self.numa_node,
                "cpus": list(self.cpus),
                "mem_nodes": list(self.mem_nodes),
                "nic": self.nic.name if self.nic else None,
                "env": dict(sorted(self.env.items())),
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Plan:
    """All local ranks of one node; ``host_nodes``: NUMA nodes of the host."""

    ranks: tuple[RankPlan, ...]
    allowed_cpus: tuple[int, ...]
    host_nodes: int
    step_gpus: tuple[GpuRef, ...]
    warnings: tuple[str, ...] = ()
    _by_rank: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        by_rank: dict[int, RankPlan] = {}
        for r in self.ranks:
            by_rank.setdefault(r.local_rank, r)      # the first one wins
        object.__setattr__(self, "_by_rank", by_rank)

    def rank(self, local_rank: int) -> RankPlan:
        """The plan of ``local_rank``. Raises InputError: no such rank."""
        r = self._by_rank.get(local_rank)
        if r is not None:
            return r
        raise InputError("bind", "no such local rank", str(local_rank),
                         hint=f"the plan has local ranks 0-{len(self.ranks) - 1}")

    def to_json(self) -> dict:
        return {"ranks": [r.to_json() for r in self.ranks]}


def _resolve_token(tok: DeviceToken, topo: Topology, namespace: str,
                   warnings: list[str]) -> Gpu | None:
    """Host GPU for one token (None: unknown); ``namespace`` ``"gres"`` (minor)
    or ``"cuda"`` (ordinal in PCI order).

    Raises:
        TopologyError: a UUID prefix that matches several GPUs.
    """
    if tok.kind == "index":
        if namespace == "gres":
            g = topo.gpu_by_minor(tok.index)
            if g is None and topo.gpus and all(x.minor is None for x in topo.gpus):
                g = next((x for x in topo.gpus if x.nvml_index == tok.index), None)
                if g is not None:
                    warnings.append(f"GPU {tok.index}: minor numbers unknown, matched by NVML index")
            return g
        ordered = sorted(topo.gpus, key=lambda x: x.pci_bus_id)
        return ordered[tok.index] if tok.index < len(ordered) else None
    if tok.kind == "mig-uuid":
        warnings.append(f"{tok.text}: MIG UUID cannot be mapped to its parent GPU without "
                        "NVML MIG handles; NUMA binding of this GPU is unknown")
        return None
    hits = [g for g in topo.gpus if tok.matches_uuid(g.uuid)]
    if len(hits) > 1:
        raise TopologyError("bind", "GPU UUID prefix is ambiguous", tok.text,
                            hint="give more digits of the UUID (nvidia-smi -L)")
    return hits[0] if hits else None


def _ordinal_ok(k: int, pos: int, gres: int | None, bus: str,
                step_pci: list[str], host_pci: list[str]) -> bool:
    """Will CUDA (PCI order) read ordinal ``k`` as the GPU at ``bus``? Slurm
    writes the step position ``pos`` under device constraint, else the gres
    index; when both are possible both readings must agree."""
    constrained = k < len(step_pci) and step_pci[k] == bus
    unconstrained = k < len(host_pci) and host_pci[k] == bus
    if k == pos and k != gres:
        return constrained
    if k == gres and k != pos:
        return unconstrained
    if k == pos == gres:
        return constrained and unconstrained
    return False


def resolve_step_gpus(topo: Topology, step: Sequence[DeviceToken] | None,
                      cuda: Sequence[DeviceToken] | None, device_order: str | None,
                      warnings: list[str]) -> list[GpuRef]:
    """The step's GPUs in Slurm's order from the gres tokens ``step`` and the
    ``CUDA_VISIBLE_DEVICES`` tokens ``cuda`` (entry i of one is entry i of the
    other). The CUDA name keeps Slurm's ordinal when CUDA reads it as the same
    GPU, else the UUID (field cases 8-10)."""
    pci_order = device_order in (None, "PCI_BUS_ID")
    refs: list[GpuRef] = []
    if step is not None:
        gpus = [_resolve_token(t, topo, "gres", warnings) for t in step]
        if cuda is not None and len(cuda) != len(step):
            warnings.append(f"CUDA_VISIBLE_DEVICES has {len(cuda)} entries, the step's GPU list "
                            f"{len(step)}; CUDA names taken from the GPUs themselves")
            cuda = None
        host_pci = sorted(x.pci_bus_id for x in topo.gpus)
        step_pci = sorted(g.pci_bus_id for g in gpus if g is not None)
        for i, (tok, g) in enumerate(zip(step, gpus)):
            if g is None and tok.kind != "index":
                warnings.append(f"GPU {tok.text} not found on this host (unknown/emulated)")
            index = g.minor if g is not None else tok.index
            uuid = g.uuid if g is not None else tok.parent_uuid
            c = cuda[i] if cuda is not None else None
            if c is not None and (c.kind != "index" or g is None
                                  or (pci_order and _ordinal_ok(c.index, i, tok.index, g.pci_bus_id, step_pci,
                                                                host_pci))):
                name = c.text
            elif g is not None and g.uuid:
                name = g.uuid
            else:
                name = c.text if c is not None else tok.text
            refs.append(GpuRef(index, uuid, g.pci_bus_id if g else None, name, g))
        return refs
    if cuda is not None:
        for c in cuda:
            g = _resolve_token(c, topo, "cuda", warnings) if pci_order or c.kind != "index" else None
            if g is None and c.kind != "index":
                warnings.append(f"GPU {c.text} not found on this host (unknown/emulated)")
            index = g.minor if g is not None else (c.index if c.kind == "index" else None)
            refs.append(GpuRef(index, g.uuid if g else c.parent_uuid,
                               g.pci_bus_id if g else None, c.text, g))
    return refs


def _split(cores: list[list[int]], k: int) -> tuple[list[list[int]], str]:
    """Split a pool's cores among ``k`` ranks -> (slices, how)."""
    if k <= 0:
        return [], ""
    ncores = len(cores)
    threads = [c for core in cores for c in core]
    if ncores >= k:
        out = []
        for i in range(k):
            lo, hi = i * ncores // k, (i + 1) * ncores // k
            out.append([c for core in cores[lo:hi] for c in core])
        return out, "whole cores"
    t = len(threads)
    if t >= k:
        return [threads[i * t // k:(i + 1) * t // k] for i in range(k)], \
            f"{ncores} cores for {k} ranks: split by hardware thread"
    return [[threads[i % t]] for i in range(k)], \
        f"{t} CPUs for {k} ranks: ranks share CPUs round-robin"


def _pool_cores(topo: Topology, cpus: set[int]) -> list[list[int]]:
    out = [c for c in ([x for x in core if x in cpus] for core in topo.cores) if c]
    covered = {x for c in out for x in c}
    out += [[x] for x in sorted(cpus - covered)]
    out.sort(key=lambda c: c[0])
    return out


def _nearest(topo: Topology, src: int, candidates: list[int]) -> int | None:
    return min(candidates, key=lambda n: (topo.distance(src, n), n), default=None)


def _pick_nic(topo: Topology, node: int | None, gpu: Gpu | None, load: dict[str, int]) -> Nic | None:
    nics = [n for n in topo.nics if n.numa_node is not None]
    if not nics or node is None:
        return None

    def key(n: Nic):   # PCI closeness: the length of the PCI paths' common start
        return (0 if n.kind == "ib" else 1, topo.distance(node, n.numa_node),
                -len(os.path.commonprefix([gpu.pci_path, n.pci_path])) if gpu and n.pci_path else 0,
                load.get(n.name, 0), n.name)
    best = min(nics, key=key)
    load[best.name] = load.get(best.name, 0) + 1
    return best


def _memory_nodes(topo: Topology, cpus: Sequence[int], why: list[str]) -> list[int]:
    """The memory nodes for a rank on ``cpus``: the nodes of those CPUs, a
    memory-less one (``MemTotal: 0 kB``) replaced by the nearest node with
    memory (SLIT distance); the replacement is added to ``why``. Never a
    node without memory."""
    out: set[int] = set()
    for n in sorted({topo.node_of_cpu(c) for c in cpus} - {None}):
        m = topo.memory_node_near(n)
        if m is None:
            continue
        if m != n:
            why.append(f"node {n} has no memory: memory on nearest node {m}")
        out.add(m)
    return sorted(out)


def max_local_ranks(topo: Topology) -> int:
    """Most local ranks a plan on ``topo`` may have: :data:`MAX_LOCAL_RANKS`,
    or the node's online CPU count when larger."""
    return max(MAX_LOCAL_RANKS, len(topo.cpus_online))


def make_plan(topo: Topology, step_gpus: Sequence[GpuRef], nranks: int,
              allowed_cpus: Sequence[int], gpu_isolation: bool = False,
              environ: Mapping[str, str] | None = None,
              warnings: Sequence[str] = ()) -> Plan:
    """The plan for ``nranks`` local ranks (module doc). ``environ`` is read
    for a user's ``CUDA_DEVICE_ORDER`` (kept, with a warning).

    Raises:
        InputError: ``nranks`` < 1 or above :func:`max_local_ranks`, or no
            allowed CPU is online (a wrong ``--allowed-cpus`` or host root).
    """
    environ = environ or {}
    if nranks < 1:
        raise InputError("bind", "number of local ranks must be >= 1", str(nranks))
    online = set(topo.cpus_online)
    cap = max_local_ranks(topo)
    if nranks > cap:
        raise InputError("bind", "too many local ranks", f"{nranks}, this node plans at most {cap}",
                         hint=f"a node runs at most {cap} tasks here ({MAX_LOCAL_RANKS} or one per online CPU)")
    allowed = sorted(set(allowed_cpus) & online) if online else sorted(set(allowed_cpus))
    if not allowed:
        raise InputError("bind", "no allowed CPU is online",
                         f"allowed {format_cpulist(allowed_cpus)!r}, online {format_cpulist(online)!r}",
                         hint="check --allowed-cpus and --host-root")
    allowed_set = set(allowed)
    plan_warn = list(warnings)
    gpus = list(step_gpus)
    g = len(gpus)
    # rank r owns GPU r % g, or with fewer ranks than GPUs the GPUs r, r + nranks, ...
    owned = [([r % g] if nranks >= g else list(range(r, g, nranks))) if g else [] for r in range(nranks)]
    rank_warn: list[list[str]] = [[] for _ in range(nranks)]
    rank_why: list[list[str]] = [[] for _ in range(nranks)]

    # home node per rank
    node_cpus = {n.id: set(n.cpus) & allowed_set for n in topo.nodes}
    pool_of: list[object] = []
    for r in range(nranks):
        ref = gpus[owned[r][0]] if owned[r] else None
        if ref is None or ref.gpu is None:
            home = topo.nodes[0].id if len(topo.nodes) == 1 else None
            rank_why[r].append("no GPU" if ref is None else f"GPU {ref.label()} unknown/emulated")
        else:
            home = ref.gpu.numa_node
            src = ref.gpu.numa_source
            spans = len({topo.node_of_cpu(c) for c in ref.gpu.local_cpus} - {None}) > 1
            if home is not None:
                rank_why[r].append(f"GPU {ref.label()} on node {home} ({src})")
            elif not spans:
                rank_why[r].append(f"GPU {ref.label()} NUMA node unknown")
            if home is None and not spans:
                rank_warn[r].append(f"GPU {ref.label()} ({ref.pci_bus_id}): NUMA node unknown, "
                                    "no memory binding")
        if home is not None and not node_cpus.get(home):
            cands = [n for n, cs in node_cpus.items() if cs]
            near = _nearest(topo, home, cands)
            label = ref.label() if ref is not None else "-"
            rank_warn[r].append(f"GPU {label} has no local CPUs in allocation "
                                f"(node {home}); using nearest node {near}")
            home = near
        pool_of.append(home)

    # spill ranks from overfull nodes to the nearest node with spare CPUs
    load: dict[object, int] = {}
    for p in pool_of:
        load[p] = load.get(p, 0) + 1

    def count(node) -> int:
        return load.get(node, 0)

    def move(r: int, to: object) -> None:
        load[pool_of[r]] -= 1
        load[to] = load.get(to, 0) + 1
        pool_of[r] = to

    for node in sorted({p for p in pool_of if p is not None}):
        cap = len(node_cpus[node])
        while count(node) > cap:
            spare = [n for n, cs in node_cpus.items() if n != node and len(cs) > count(n)]
            near = _nearest(topo, node, spare)
            if near is None:
                break
            r = max(i for i, p in enumerate(pool_of) if p == node)
            move(r, near)
            rank_warn[r].append(f"node {node} has {cap} allowed CPUs for more ranks; "
                                f"spilled to nearest node {near}")

    # ranks whose GPU affinity spans nodes: its free CPUs, else the least loaded node of it
    known = [p is not None for p in pool_of]
    pool_cpus: dict[object, set[int]] = {n: set(cs) for n, cs in node_cpus.items()}
    taken = {c for n in set(pool_of) if n is not None for c in node_cpus[n]}
    for r in range(nranks):
        ref = gpus[owned[r][0]] if owned[r] else None
        if pool_of[r] is not None or ref is None or ref.gpu is None:
            continue
        aff = set(ref.gpu.local_cpus) & allowed_set
        spanned = {topo.node_of_cpu(c) for c in aff} - {None}
        if len(spanned) < 2:
            continue
        free = aff - taken
        if free:
            key = ("affinity", frozenset(free))
            pool_cpus[key] = set(free)
            move(r, key)
            rank_why[r].append(f"no NUMA locality: GPU {ref.label()} affinity "
                               f"{format_cpulist(sorted(aff))} spans nodes "
                               f"{format_cpulist(sorted(spanned))}, no memory binding")
        else:
            cands = [n for n in sorted(spanned) if node_cpus.get(n)]
            best = max(cands, key=lambda n: (len(node_cpus[n]) / (count(n) + 1), -n))
            move(r, best)
            rank_why[r].append(f"no NUMA locality: GPU {ref.label()} affinity spans nodes "
                               f"{format_cpulist(sorted(spanned))}; CPUs from node {best} "
                               "(most allowed CPUs per rank), no memory binding")

    # ranks whose GPU node is unknown: the node with the most allowed CPUs per rank
    for r in range(nranks):
        if pool_of[r] is None:
            cands = [n for n, cs in node_cpus.items() if cs]
            best = max(cands, key=lambda n: (len(node_cpus[n]) / (count(n) + 1), -n))
            move(r, best)
            rank_why[r].append(f"CPUs from node {best} (most allowed CPUs per rank), no memory binding")

    # CPU slices per pool
    cpus_of: list[list[int]] = [[] for _ in range(nranks)]
    for pool in sorted(set(pool_of), key=lambda k: (isinstance(k, tuple), str(k))):
        members = [r for r in range(nranks) if pool_of[r] == pool]
        slices, how = _split(_pool_cores(topo, pool_cpus[pool]), len(members))
        where = f"node {pool}" if isinstance(pool, int) else "the GPU's affinity"
        for r, s in zip(members, slices):
            cpus_of[r] = s
            if "round-robin" in how:
                rank_warn[r].append(how)
            else:
                rank_why[r].append(f"{how} of {where}")

    # env
    order = environ.get("CUDA_DEVICE_ORDER")
    if order is not None and order != "PCI_BUS_ID":
        plan_warn.append(f"CUDA_DEVICE_ORDER={order} kept as set by the user; "
                         "PCI_BUS_ID is what nvidia-smi and Slurm use")
    names = [x.cuda_name for x in gpus]
    nic_load: dict[str, int] = {}
    ranks = []
    for r in range(nranks):
        cpus = sorted(cpus_of[r])
        if not cpus:  # a pool of CPUs outside every node: never bind to []
            cpus = list(allowed)
            rank_warn[r].append("empty CPU slice; using all allowed CPUs")
        node = pool_of[r] if known[r] else None
        mem = _memory_nodes(topo, cpus, rank_why[r]) if node is not None else []
        own = [gpus[i] for i in owned[r]]
        ref = own[0] if own else None
        nic_node = pool_of[r] if isinstance(pool_of[r], int) else None
        nic = _pick_nic(topo, nic_node, ref.gpu if ref else None, nic_load)
        env = {"LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(nranks),
               "OMP_NUM_THREADS": str(len(cpus)), "GSRUN_BIND_CPUS": format_cpulist(cpus)}
        unset: tuple[str, ...] = ()
        if g:
            if gpu_isolation:
                vis = [names[i] for i in owned[r]]
            else:
                vis = list(names)
                pos = r % g
                cur = owned[r][0]
                vis[pos], vis[cur] = vis[cur], vis[pos]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(vis)
            env["CUDA_DEVICE_ORDER"] = order if order is not None else "PCI_BUS_ID"
            unset = FOREIGN_GPU_VARS
        if nic is not None:
            if nic.kind == "ib":
                env["NCCL_IB_HCA"] = nic.name
            if nic.netdevs:
                env["NCCL_SOCKET_IFNAME"] = nic.netdevs[0]
        why = list(rank_why[r])
        if nic is not None:
            why.append(f"NIC {nic.name} on node {nic.numa_node}")
        reason = "; ".join(why + [f"warning: {w}" for w in rank_warn[r]])
        ranks.append(RankPlan(local_rank=r, gpu=ref, gpus=tuple(own), numa_node=node,
                              cpus=tuple(cpus), mem_nodes=tuple(mem), nic=nic, env=env,
                              unset=unset, reason=reason, warnings=tuple(rank_warn[r])))
    return Plan(ranks=tuple(ranks), allowed_cpus=tuple(allowed), host_nodes=len(topo.nodes),
                step_gpus=tuple(gpus), warnings=tuple(plan_warn))


def fallback_rank(local_rank: int, nranks: int, allowed_cpus: Sequence[int], why: str) -> RankPlan:
    """A rank bound to all (non-empty) allowed CPUs, no GPU change: when no plan can be made."""
    cpus = tuple(sorted(set(allowed_cpus)))
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(nranks),
           "OMP_NUM_THREADS": str(len(cpus)), "GSRUN_BIND_CPUS": format_cpulist(cpus)}
    return RankPlan(local_rank, None, (), None, cpus, (), None, env, (),
                    f"fallback to allowed CPUs; warning: {why}", (why,))


def rank_env(plan: Plan, local_rank: int) -> dict[str, str]:
    """Variables to set for ``local_rank`` (those to remove: ``.unset``).
    Raises InputError: no such rank."""
    return dict(plan.rank(local_rank).env)


_MIG_UUID = r"MIG-[0-9A-Za-z-]{8,64}(/[0-9]{1,3}/[0-9]{1,3})?"


def mig_visible_devices(devices: list[str], local_rank: int, gpu_isolation: bool = False) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a rank over the prolog's MIG device UUIDs:
    all, entry ``LOCAL_RANK`` its own (``devices[local_rank % n]``); with
    ``gpu_isolation`` only its own; None: no valid device."""

    devs = [d for d in devices if isinstance(d, str) and re.fullmatch(_MIG_UUID, d)]
    if not devs:
        return None
    own = devs[local_rank % len(devs)]
    if gpu_isolation:
        return own
    rest = [d for d in devs if d != own]
    pos = min(local_rank, len(devs) - 1)
    return ",".join(rest[:pos] + [own] + rest[pos:])
