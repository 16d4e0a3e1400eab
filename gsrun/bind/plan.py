"""The per-rank binding plan: GPU, CPUs, memory node and NIC for each local
rank of a step on one node.

Layout (mpibind's "the library computes, the adapter applies"):

- **decisions** (pure, no I/O): :func:`resolve_step_gpus`, :func:`make_plan`,
  :func:`rank_env`, :func:`render_table`;
- **adapter** (reads facts, still no effects): :func:`plan_from_env` reads
  the topology through a :class:`~gsrun.facts.hostfs.HostFS` and the Slurm task
  environment, then calls :func:`make_plan`;
- **effects** (thin): :func:`apply_affinity`, :func:`exec_argv`.

The plan's rules:

1. **GPUs.** The step's GPUs come from ``SLURM_STEP_GPUS`` (else
   ``SLURM_JOB_GPUS``), which are gres indices = ``/dev/nvidiaN`` minor
   numbers (field case 8; field cases are described in
   docs/field-cases.md), matched to host GPUs by minor number, then by
   UUID; ``CUDA_VISIBLE_DEVICES`` gives the names CUDA will use in the task
   (cgroup-local ordinals under ``ConstrainDevices``, field case 9; UUIDs;
   MIG UUIDs resolved to the parent GPU, field case 11). A GPU the host does not
   show (an emulated gres, a driver-less node) stays in the plan with its
   index only ("unknown/emulated").
2. **Ranks to GPUs.** ``n`` ranks, ``g`` GPUs: rank ``r`` owns GPU
   ``r % g`` when ``n >= g`` (so ``LOCAL_RANK % device_count`` selects it),
   and GPUs ``{i : i % n == r}`` when ``g > n``.
3. **CPUs.** Each rank draws from a *pool*: its GPU's NUMA node ∩ the
   allowed CPUs. A node with no allowed CPU (a cpuset that excludes the
   GPU's socket, field case 3) sends its ranks to the nearest node (SLIT
   distance) that has some; a node with fewer allowed CPUs than ranks spills
   its extra ranks to the nearest node with spare CPUs; a node without CPUs
   (GPU or HBM memory exposed as a NUMA node) is never a CPU pool. A GPU
   with no NUMA locality (node unknown, its CPU affinity spanning several
   nodes: a VM whose vNUMA does not follow the host) gives its ranks the
   allowed CPUs of its affinity not taken by ranks of known nodes, split
   among the ranks sharing that affinity (when none is left, the node of
   the affinity with the most allowed CPUs per rank), no memory binding,
   reason "no NUMA locality". Other ranks whose GPU node is unknown (field
   case 1 with no NVML, emulated GPUs on a multi-node host) take the node
   with the most allowed CPUs per rank and get no memory binding. Inside a pool the CPUs are split into
   contiguous, disjoint, near-equal slices: by whole cores while there are at
   least as many cores as ranks, else by hardware threads in core order;
   with more ranks than CPUs, ranks share CPUs round-robin (each >= 1). A
   rank never gets a CPU outside the allowed set, never an empty set.
4. **Memory.** ``mem_nodes`` = the NUMA nodes of the rank's CPUs when its
   node is known, else ``[]``; a memory-less node (``MemTotal: 0 kB``:
   POWER LPARs, some VM firmware) is replaced by the nearest node with
   memory (SLIT distance), so a memory policy never names a node without
   memory.
5. **NIC.** Nearest by NUMA distance to the rank's CPUs, then PCI closeness
   to its GPU (longest common sysfs path), then fewest ranks already on it;
   InfiniBand/RoCE before Ethernet. ``None`` when no NIC has a known node.

NCCL note (field case 3, nccl-tests#57): NCCL intersects a GPU's ideal mask
with the process's mask; since each rank's mask is its GPU's node ∩ the
cpuset, NCCL's helper threads land on the same CPUs, which is what we want.
``NCCL_IGNORE_CPU_AFFINITY`` is therefore not set.
"""

from __future__ import annotations

import os

from gsrun.base.cpulist import format_cpulist
from gsrun.facts.devices import DeviceToken, parse_device_list
from gsrun.base.errors import GsrunError, InputError, TopologyError
from gsrun.base.frozen import Frozen
from gsrun.base.ids import is_job_id, is_node_name
from gsrun.facts.hostfs import HostFS
from gsrun.facts.slurm import parse_tasks_per_node
from gsrun.facts.topology import NVML_IF_NEEDED, Gpu, Nic, Topology, read_allowed_cpus, read_topology

TYPE_CHECKING = False   # not `typing`
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# `re` is imported only where a MIG UUID is checked: the SPANK plugin imports
# this module in every bound step (tests/bench/bench_spank_host.py).

#: variables of other vendors' runtimes that Slurm may set on an NVIDIA node
#: (field case 11, docs/field-cases.md); unset in NVIDIA steps.
FOREIGN_GPU_VARS = ("ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ZE_AFFINITY_MASK")


class GpuRef(Frozen):
    """A step GPU: ``index`` Slurm's gres index (= minor number; the token's
    index for an unknown/emulated GPU; None when given only by UUID and not
    found), ``uuid`` and ``pci_bus_id`` (None when unknown), ``cuda_name``
    the ``CUDA_VISIBLE_DEVICES`` entry that selects it in the task, ``gpu``
    the host fact (None = unknown/emulated)."""

    __slots__ = ("index", "uuid", "pci_bus_id", "cuda_name", "gpu")
    _defaults = {"gpu": None}
    _no_compare = frozenset({"gpu"})
    index: int | None
    uuid: str | None
    pci_bus_id: str | None
    cuda_name: str
    gpu: Gpu | None

    def label(self) -> str:
        if self.index is not None:
            return str(self.index)
        return self.uuid or self.cuda_name

    def to_json(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id}


class RankPlan(Frozen):
    """One local rank's binding. ``cpus`` sorted, never empty when the host
    has an online CPU; ``numa_node`` None = unknown; ``env`` variables to
    set, ``unset`` variables to remove; ``warnings`` also folded into
    ``reason``."""

    __slots__ = ("local_rank", "gpu", "gpus", "numa_node", "cpus", "mem_nodes", "nic", "env", "unset",
                 "reason", "warnings")
    _defaults = {"warnings": ()}
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
    warnings: tuple[str, ...]

    def to_json(self) -> dict:
        return {"local_rank": self.local_rank,
                "gpu": self.gpu.to_json() if self.gpu else None,
                "numa_node": self.numa_node,
                "cpus": list(self.cpus),
                "mem_nodes": list(self.mem_nodes),
                "nic": self.nic.name if self.nic else None,
                "env": dict(sorted(self.env.items())),
                "reason": self.reason}


class Plan(Frozen):
    """All local ranks of one node. ``host_nodes`` = number of NUMA nodes
    of the host (memory binding only matters when > 1)."""

    __slots__ = ("ranks", "allowed_cpus", "host_nodes", "step_gpus", "warnings")
    _defaults = {"warnings": ()}
    ranks: tuple[RankPlan, ...]
    allowed_cpus: tuple[int, ...]
    host_nodes: int
    step_gpus: tuple[GpuRef, ...]
    warnings: tuple[str, ...]

    def rank(self, local_rank: int) -> RankPlan:
        for r in self.ranks:
            if r.local_rank == local_rank:
                return r
        raise InputError("bind", "no such local rank", str(local_rank),
                         hint=f"the plan has local ranks 0-{len(self.ranks) - 1}")

    def to_json(self) -> dict:
        """The ``gsrun-bind --plan --json`` document: ``{"ranks": [...]}``."""
        return {"ranks": [r.to_json() for r in self.ranks]}


# ---------------------------------------------------------------- GPUs

def _resolve_token(tok: DeviceToken, topo: Topology, namespace: str,
                   warnings: list[str]) -> Gpu | None:
    """Host GPU for one token; None = unknown. ``namespace`` ``"gres"``
    (index = minor number) or ``"cuda"`` (index = CUDA ordinal in PCI order).

    Raises:
        TopologyError: a UUID prefix that matches several GPUs.
    """
    if tok.kind == "index":
        if namespace == "gres":
            g = topo.gpu_by_minor(tok.index)
            if g is None and topo.gpus and all(x.minor is None for x in topo.gpus):
                # no minor number known at all: NVML index is the best guess
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
    """Will CUDA (PCI order) read ordinal ``k`` as the GPU at ``bus``?
    Slurm writes ``pos`` (the position in the step) in a device-constrained
    step, where the task sees only the step's GPUs, and the gres index in an
    unconstrained one, where it sees all host GPUs; when both are possible
    both readings must agree."""
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
    """The step's GPUs, in Slurm's order, each with its CUDA name.

    ``step``: tokens of ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``/``--gpus``
    (gres namespace) or None; ``cuda``: tokens of ``CUDA_VISIBLE_DEVICES`` or
    None. With both of equal length, entry i of one is entry i of the other
    (Slurm writes them that way). The CUDA name keeps Slurm's ordinal when
    CUDA will read it as the same GPU (``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    ordinal = position in PCI order among the GPUs the task sees), else the
    GPU's UUID (never a bare physical index that CUDA would misread, field
    cases 8-10, docs/field-cases.md).
    """
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
            name = None
            if cuda is not None:
                c = cuda[i]
                if c.kind != "index" or g is None:
                    name = c.text
                elif pci_order and _ordinal_ok(c.index, i, tok.index, g.pci_bus_id, step_pci, host_pci):
                    name = c.text
            if name is None:
                if g is not None and g.uuid:
                    name = g.uuid
                elif cuda is not None:
                    name = cuda[i].text
                else:
                    name = tok.text
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


# ---------------------------------------------------------------- CPUs

def _split(cores: list[list[int]], k: int) -> tuple[list[list[int]], str]:
    """Split a pool (cores = allowed sibling lists, in order) among ``k``
    ranks: contiguous, disjoint, near-equal. Returns slices and how."""
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
    out = []
    for core in topo.cores:
        c = [x for x in core if x in cpus]
        if c:
            out.append(c)
    covered = {x for c in out for x in c}
    out += [[x] for x in sorted(cpus - covered)]
    out.sort(key=lambda c: c[0])
    return out


def _nearest(topo: Topology, src: int, candidates: list[int]) -> int | None:
    if not candidates:
        return None
    return min(candidates, key=lambda n: (topo.distance(src, n), n))


def _pick_nic(topo: Topology, node: int | None, gpu: Gpu | None, load: dict[str, int]) -> Nic | None:
    nics = [n for n in topo.nics if n.numa_node is not None]
    if not nics or node is None:
        return None

    def common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
        k = 0
        for x, y in zip(a, b):
            if x != y:
                break
            k += 1
        return k

    def key(n: Nic):
        return (0 if n.kind == "ib" else 1, topo.distance(node, n.numa_node),
                -common(gpu.pci_path, n.pci_path) if gpu and n.pci_path else 0,
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


def make_plan(topo: Topology, step_gpus: Sequence[GpuRef], nranks: int,
              allowed_cpus: Sequence[int], gpu_isolation: bool = False,
              environ: Mapping[str, str] | None = None,
              warnings: Sequence[str] = ()) -> Plan:
    """The plan for ``nranks`` local ranks (see the module doc for rules).

    ``allowed_cpus``: the task's CPUs (affinity / cpuset); offline CPUs in it
    are dropped. ``environ``: the task environment, read only for
    ``CUDA_DEVICE_ORDER`` (a user's value is kept, with a warning).

    Raises:
        InputError: ``nranks`` < 1, or no allowed CPU is online (a wrong
            ``--allowed-cpus`` or host root).
    """
    environ = environ or {}
    if nranks < 1:
        raise InputError("bind", "number of local ranks must be >= 1", str(nranks))
    online = set(topo.cpus_online)
    allowed = sorted(set(allowed_cpus) & online) if online else sorted(set(allowed_cpus))
    if not allowed:
        raise InputError("bind", "no allowed CPU is online",
                         f"allowed {format_cpulist(allowed_cpus)!r}, online {format_cpulist(online)!r}",
                         hint="check --allowed-cpus and --host-root")
    allowed_set = set(allowed)
    plan_warn = list(warnings)
    gpus = list(step_gpus)
    g = len(gpus)
    owned: list[list[int]] = []
    for r in range(nranks):
        if g == 0:
            owned.append([])
        elif nranks >= g:
            owned.append([r % g])
        else:
            owned.append([i for i in range(g) if i % nranks == r])
    rank_warn: list[list[str]] = [[] for _ in range(nranks)]
    rank_why: list[list[str]] = [[] for _ in range(nranks)]

    # home node per rank
    node_cpus = {n.id: set(n.cpus) & allowed_set for n in topo.nodes}
    pool_of: list[object] = []
    for r in range(nranks):
        ref = gpus[owned[r][0]] if owned[r] else None
        home = ref.gpu.numa_node if ref is not None and ref.gpu is not None else None
        if ref is not None and ref.gpu is None:
            home = topo.nodes[0].id if len(topo.nodes) == 1 else None
            rank_why[r].append(f"GPU {ref.label()} unknown/emulated")
        if ref is None:
            home = topo.nodes[0].id if len(topo.nodes) == 1 else None
            rank_why[r].append("no GPU")
        elif ref.gpu is not None:
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
    def count(node):
        return sum(1 for p in pool_of if p == node)
    for node in sorted({p for p in pool_of if p is not None}):
        cap = len(node_cpus[node])
        while count(node) > cap:
            spare = [n for n, cs in node_cpus.items() if n != node and len(cs) > count(n)]
            near = _nearest(topo, node, spare)
            if near is None:
                break
            r = max(i for i, p in enumerate(pool_of) if p == node)
            pool_of[r] = near
            rank_warn[r].append(f"node {node} has {cap} allowed CPUs for more ranks; "
                                f"spilled to nearest node {near}")

    # ranks whose GPU has no NUMA locality (node unknown, its CPU affinity
    # spans several nodes: a VM whose vNUMA does not follow the host): the
    # CPUs of the GPU's own affinity, split among the ranks sharing that
    # affinity, minus the nodes already taken by ranks with a known node;
    # when nothing is left, they join the least loaded node of the affinity
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
            pool_of[r] = key
            rank_why[r].append(f"no NUMA locality: GPU {ref.label()} affinity "
                               f"{format_cpulist(sorted(aff))} spans nodes "
                               f"{format_cpulist(sorted(spanned))}, no memory binding")
        else:
            cands = [n for n in sorted(spanned) if node_cpus.get(n)]
            best = max(cands, key=lambda n: (len(node_cpus[n]) / (count(n) + 1), -n))
            pool_of[r] = best
            rank_why[r].append(f"no NUMA locality: GPU {ref.label()} affinity spans nodes "
                               f"{format_cpulist(sorted(spanned))}; CPUs from node {best} "
                               "(most allowed CPUs per rank), no memory binding")

    # ranks whose GPU node is unknown: the node with the most allowed CPUs
    # per rank (no overlap while CPUs suffice), but no memory binding
    for r in range(nranks):
        if pool_of[r] is None:
            cands = [n for n, cs in node_cpus.items() if cs]
            best = max(cands, key=lambda n: (len(node_cpus[n]) / (count(n) + 1), -n))
            pool_of[r] = best
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
        if not cpus:  # cannot happen with a non-empty allowed set; never bind to []
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
    """A rank bound to all allowed CPUs, no GPU change: what a task gets when
    its plan cannot be made. ``allowed_cpus`` must be non-empty."""
    cpus = tuple(sorted(set(allowed_cpus)))
    env = {"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(nranks),
           "OMP_NUM_THREADS": str(len(cpus)), "GSRUN_BIND_CPUS": format_cpulist(cpus)}
    return RankPlan(local_rank, None, (), None, cpus, (), None, env, (),
                    f"fallback to allowed CPUs; warning: {why}", (why,))


def rank_env(plan: Plan, local_rank: int) -> dict[str, str]:
    """Variables to set for ``local_rank`` (LOCAL_RANK, LOCAL_WORLD_SIZE,
    OMP_NUM_THREADS, GSRUN_BIND_CPUS, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER,
    NCCL_IB_HCA / NCCL_SOCKET_IFNAME). Variables to *remove* are in
    ``plan.rank(local_rank).unset``.

    Raises:
        InputError: no such local rank in the plan.
    """
    return dict(plan.rank(local_rank).env)


# ---------------------------------------------------------------- adapter

def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    v = environ.get(name)
    if v is None or not v.strip():
        return None
    v = v.strip()
    if not v.isdigit():
        raise InputError("bind", f"{name} is not a number", repr(v)[:60])
    return int(v)


def _tasks_per_node(text: str, name: str) -> list[int]:
    """``4(x2),2`` -> ``[4, 4, 2]`` (:func:`gsrun.facts.slurm.parse_tasks_per_node`),
    with the error named for the task's variable."""
    try:
        return parse_tasks_per_node(text)
    except InputError:
        raise InputError("bind", f"bad {name}", repr(text)[:80],
                         hint="Slurm writes forms like 4(x2),2") from None


def ntasks_from_env(environ: Mapping[str, str]) -> int | None:
    """Local task count: ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE``
    (``4(x2),2``, entry ``SLURM_NODEID``), else ``SLURM_NTASKS_PER_NODE``.

    Raises:
        InputError: a malformed value.
    """
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        v = environ.get(name)
        if v and v.strip():
            counts = _tasks_per_node(v, name)
            if counts:
                nid = _int_env(environ, "SLURM_NODEID") or 0
                return counts[min(nid, len(counts) - 1)]
    return _int_env(environ, "SLURM_NTASKS_PER_NODE")


def worker_environ(environ: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """The environment of a worker a per-node launcher started (torchrun
    under ``gsrun --launcher torchrun``): Slurm's ``SLURM_LOCALID`` and task
    counts describe the one launcher task, not the worker, so ``LOCAL_RANK``
    and ``LOCAL_WORLD_SIZE`` take their place. Returns (environment, True)
    for such a worker; the environment unchanged and False otherwise.

    A worker is a process with ``LOCAL_RANK`` < ``LOCAL_WORLD_SIZE`` (both
    numbers) where ``GSRUN_LAUNCHER`` is set or Slurm's local task count is
    not ``LOCAL_WORLD_SIZE`` (one task per GPU with the same counts is
    described by Slurm already).
    """
    env = dict(environ)
    lr = (environ.get("LOCAL_RANK") or "").strip()
    lws = (environ.get("LOCAL_WORLD_SIZE") or "").strip()
    if not (lr.isdigit() and lws.isdigit()) or int(lr) >= int(lws):
        return env, False
    try:
        n = ntasks_from_env(environ)
    except InputError:
        n = None
    if not environ.get("GSRUN_LAUNCHER") and n == int(lws):
        return env, False
    env["SLURM_LOCALID"] = str(int(lr))
    env["SLURM_NTASKS_PER_NODE"] = str(int(lws))
    env.pop("SLURM_STEP_TASKS_PER_NODE", None)
    env.pop("SLURM_TASKS_PER_NODE", None)
    return env, True


#: Slurm task variables that describe a launcher's one task; a worker of it gets torchrun's world instead
WORKER_TASK_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS",
                    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE")


def worker_task_env(environ: Mapping[str, str]) -> dict[str, str | None]:
    """For a launcher's worker (:func:`worker_environ`): the Slurm task
    variables that would contradict torchrun's ``RANK`` / ``LOCAL_RANK`` /
    ``WORLD_SIZE`` / ``LOCAL_WORLD_SIZE`` -> their values in the worker's
    environment, None to unset. ``SLURM_PROCID`` = ``RANK``, ``SLURM_LOCALID``
    = ``LOCAL_RANK``, ``SLURM_NTASKS`` = ``SLURM_NPROCS`` =
    ``SLURM_STEP_NUM_TASKS`` = ``WORLD_SIZE``, ``SLURM_NTASKS_PER_NODE`` =
    ``LOCAL_WORLD_SIZE``; the per-node task lists are unset. A torchrun
    variable that is not a number unsets its Slurm counterparts, so a
    framework that reads Slurm's (Lightning, Accelerate) sees one world."""
    def num(name: str) -> str | None:
        v = (environ.get(name) or "").strip()
        return str(int(v)) if v.isdigit() else None
    world = num("WORLD_SIZE")
    return {"SLURM_PROCID": num("RANK"), "SLURM_LOCALID": num("LOCAL_RANK"), "SLURM_NTASKS": world,
            "SLURM_NPROCS": world, "SLURM_STEP_NUM_TASKS": world, "SLURM_NTASKS_PER_NODE": num("LOCAL_WORLD_SIZE"),
            "SLURM_TASKS_PER_NODE": None, "SLURM_STEP_TASKS_PER_NODE": None}


def plan_from_env(environ: Mapping[str, str], hostfs: HostFS,
                  allowed_cpus: list[int] | None = None, gpu_isolation: bool = False,
                  topology: Topology | None = None) -> Plan:
    """Plan all local ranks of this node from a Slurm task environment.

    Reads ``SLURM_STEP_GPUS`` (else ``SLURM_JOB_GPUS``), ``CUDA_VISIBLE_DEVICES``,
    ``CUDA_DEVICE_ORDER``, the task counts (:func:`ntasks_from_env`, else one
    per GPU, else 1) and ``SLURM_LOCALID`` (the count is raised to cover it).
    ``allowed_cpus`` None: the process's affinity on the live host, all
    online CPUs under a host root. ``topology`` skips reading the host;
    without it the host is read sysfs/procfs first, NVML only for what they
    leave unknown (:data:`gsrun.facts.topology.NVML_IF_NEEDED`: the plan is
    the same either way).

    Raises:
        InputError: a malformed Slurm/CUDA variable (see
            :func:`gsrun.facts.devices.parse_device_list`), no allowed CPU online.
        TopologyError: an ambiguous GPU UUID prefix.
    """
    topo = topology if topology is not None else read_topology(hostfs, nvml=NVML_IF_NEEDED)
    if allowed_cpus is None:
        allowed_cpus = read_allowed_cpus(hostfs, topo.cpus_online)
    warns: list[str] = []
    step_var = environ.get("SLURM_STEP_GPUS")
    if step_var is None:
        step_var = environ.get("SLURM_JOB_GPUS")
    step = parse_device_list(step_var, allow_ranges=True)
    cuda = parse_device_list(environ.get("CUDA_VISIBLE_DEVICES"))
    refs = resolve_step_gpus(topo, step, cuda, environ.get("CUDA_DEVICE_ORDER"), warns)
    n = ntasks_from_env(environ)
    if n is None:
        n = max(1, len(refs))
    lr = _int_env(environ, "SLURM_LOCALID")
    if lr is not None and lr >= n:
        warns.append(f"SLURM_LOCALID {lr} >= tasks per node {n}; planning {lr + 1} ranks")
        n = lr + 1
    return make_plan(topo, refs, n, allowed_cpus, gpu_isolation, environ, warns)


# ---------------------------------------------------------------- effects

def apply_affinity(rank_plan: RankPlan, pid: int = 0) -> list[int]:
    """``os.sched_setaffinity(pid, cpus)``; returns the CPUs applied. Never
    called with an empty set: an empty plan leaves the affinity unchanged.

    Raises:
        OSError: EINVAL when no planned CPU is in the task's cpuset (a plan
            made for another host or cgroup), ESRCH for a vanished pid.
    """
    cpus = list(rank_plan.cpus)
    if not cpus:
        return sorted(os.sched_getaffinity(pid))
    os.sched_setaffinity(pid, cpus)
    return cpus


def exec_argv(rank_plan: RankPlan, host_nodes: int, command: Sequence[str],
              allowed_mems: Sequence[int] | None = None,
              numactl: str | None = None) -> list[str]:
    """The argv to exec: ``numactl --membind=N -- CMD...`` when numactl
    exists (``numactl`` path, else looked up), the rank's node is known, the
    host has > 1 node and the nodes are within ``allowed_mems`` (the
    cpuset's ``Mems_allowed_list``; numactl fails outside it); else CMD."""
    cmd = list(command)
    mems = [m for m in rank_plan.mem_nodes if m is not None and m >= 0]
    if allowed_mems is not None:
        mems = [m for m in mems if m in set(allowed_mems)]
    if rank_plan.numa_node is None or rank_plan.numa_node < 0 or host_nodes <= 1 or not mems:
        return cmd
    import shutil

    exe = numactl or shutil.which("numactl")
    if not exe:
        return cmd
    return [exe, "--membind=" + ",".join(str(m) for m in mems), "--", *cmd]


# ---------------------------------------------------------------- table

def _link(topo: Topology, a_node: int | None, a_path: tuple[str, ...],
          b_node: int | None, b_path: tuple[str, ...]) -> str:
    """nvidia-smi-like connection type from sysfs paths and nodes: PIX/PXB
    (common PCI bridge), PHB (same root port), NODE (same node), SYS."""
    k = 0
    for x, y in zip(a_path, b_path):
        if x != y:
            break
        k += 1
    if k >= 2:
        return "PIX" if len(a_path) - k <= 1 and len(b_path) - k <= 1 else "PXB"
    if k == 1:
        return "PHB"
    if a_node is not None and a_node == b_node:
        return "NODE"
    return "SYS" if a_node is not None and b_node is not None else "?"


def render_table(topology: Topology, plan: Plan | None) -> str:
    """Human table like ``nvidia-smi topo -m`` (GPU/NIC connection matrix,
    CPU affinity, NUMA node) followed by the plan's binding per rank."""
    topo = topology
    gpus = list(topo.gpus)
    nics = list(topo.nics)
    cols = [f"GPU{g.minor if g.minor is not None else i}" for i, g in enumerate(gpus)] + \
           [f"NIC{i}" for i in range(len(nics))]
    paths = [(g.numa_node, g.pci_path) for g in gpus] + [(n.numa_node, n.pci_path) for n in nics]
    lines = []
    head = ["", *cols, "CPU Affinity", "NUMA Affinity", "Bus Id", "UUID"]
    rows = [head]
    for i, g in enumerate(gpus):
        links = ["X" if j == i else _link(topo, *paths[i], *paths[j]) for j in range(len(cols))]
        rows.append([cols[i], *links, format_cpulist(g.local_cpus) or "N/A",
                     str(g.numa_node) if g.numa_node is not None else "N/A",
                     g.pci_bus_id, g.uuid or "N/A"])
    for k, n in enumerate(nics):
        i = len(gpus) + k
        links = ["X" if j == i else _link(topo, *paths[i], *paths[j]) for j in range(len(cols))]
        rows.append([cols[i], *links, "", str(n.numa_node) if n.numa_node is not None else "N/A",
                     n.pci_bus_id or "", ""])
    widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    if not gpus:
        lines.append("(no NVIDIA GPU found on this host)")
    if nics:
        lines.append("")
        lines.append("NIC Legend:")
        for k, n in enumerate(nics):
            lines.append(f"  NIC{k}: {n.name}" + (f" ({','.join(n.netdevs)})" if n.netdevs else ""))
    lines.append("")
    lines.append("NUMA nodes:")
    for n in topo.nodes:
        mem = f", {n.mem_total_bytes / 2**30:.1f} GiB" if n.mem_total_bytes else ""
        lines.append(f"  node{n.id}: CPUs {format_cpulist(n.cpus) or '-'}{mem}")
    if plan is not None:
        lines.append("")
        lines.append(f"Binding ({len(plan.ranks)} local ranks, allowed CPUs "
                     f"{format_cpulist(plan.allowed_cpus)}):")
        brows = [["rank", "gpu", "cpus", "mem", "nic", "reason"]]
        for r in plan.ranks:
            brows.append([str(r.local_rank), r.gpu.label() if r.gpu else "-",
                          format_cpulist(r.cpus), format_cpulist(r.mem_nodes) or "-",
                          r.nic.name if r.nic else "-", r.reason])
        bw = [max(len(x[c]) for x in brows) for c in range(5)]
        for x in brows:
            lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(x[:5], bw)) + "  " + x[5])
        for w in plan.warnings:
            lines.append(f"warning: {w}")
    for note in topo.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


__all__ = ["GpuRef", "RankPlan", "Plan", "FOREIGN_GPU_VARS", "resolve_step_gpus", "make_plan",
           "fallback_rank", "rank_env", "ntasks_from_env", "plan_from_env", "apply_affinity",
           "exec_argv", "render_table", "GsrunError"]


# ---------------------------------------------------------------- MIG devices of the job

_MIG_UUID = r"MIG-[0-9A-Za-z-]{8,64}(/[0-9]{1,3}/[0-9]{1,3})?"


def mig_visible_devices(devices: list[str], local_rank: int, gpu_isolation: bool = False) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a rank of a job whose prolog cut its GPUs
    into MIG devices (their UUIDs, in the prolog's order). Same convention as
    for whole GPUs: every device visible, ordered so that entry
    ``LOCAL_RANK`` is the rank's own (``devices[local_rank % n]``); with
    ``gpu_isolation`` only its own. None when there is no valid device. Pure."""
    import re

    devs = [d for d in devices if isinstance(d, str) and re.fullmatch(_MIG_UUID, d)]
    if not devs:
        return None
    own = devs[local_rank % len(devs)]
    if gpu_isolation:
        return own
    rest = [d for d in devs if d != own]
    pos = min(local_rank, len(devs) - 1)
    return ",".join(rest[:pos] + [own] + rest[pos:])


def read_job_mig_devices(spool_dir: str, job_id: str | None, node: str | None) -> list[str] | None:
    """The MIG device UUIDs the prolog created for this job on this node
    (``<spool>/jobs/<id>/user-mig-<node>.json``, owned by the job's user),
    or None when the job has no MIG layout here."""
    if not is_job_id(job_id) or not is_node_name(node):
        return None
    path = os.path.join(spool_dir, "jobs", job_id, f"user-mig-{node}.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None   # the usual case: no MIG layout, and no `json` import (~8 ms with re) in the step
    import json

    try:
        with os.fdopen(fd) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    devs = data.get("devices") if isinstance(data, dict) else None
    return [d for d in devs if isinstance(d, str)] if isinstance(devs, list) else None
