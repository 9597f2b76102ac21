"""Node capacity and where replicas fit.

Free GPUs, CPU, memory and RDMA devices are kept per node, and schedulable nodes sit in buckets
by free GPU count (one set of buckets per GPU model, plus one for "any model"), so best fit is a
short walk up the buckets instead of a scan of every node per job. Nodes are numbered by name,
and every bucket is a sorted list of those numbers, so ties go to the lowest name for free.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Sequence

from .types import JobSnap, NodeSnap

# A node that reports no CPU or memory total (0) is not limited by it.
UNTRACKED = 1e15
# CPU cores are floats; keep 0.1 + 0.2 from refusing a 0.3-core request.
EPS = 1e-9

# What placement needs to know about a job: (gpu model, GPUs per replica, replicas, CPU cores
# per replica, MiB per replica, nodes it must avoid, RDMA devices per replica).
Shape = tuple[str, int, int, float, int, frozenset[str], int]
# (node number, replicas placed on it)
Picked = list[tuple[int, int]]


def shape_of(job: JobSnap) -> Shape:
    return (
        job.gpu_model,
        job.gpus_per_replica,
        job.replicas,
        job.cpu_per_replica,
        job.memory_mib_per_replica,
        job.excluded_nodes,
        job.rdma_per_replica,
    )


def replicas_fitting(gpus: int, cpu: float, mem: float, rdma: int, shape: Shape) -> int:
    """How many replicas of `shape` fit in the given free resources."""
    g, r, c, m, d = shape[1], shape[2], shape[3], shape[4], shape[6]
    k = gpus // g if g > 0 else r
    if d > 0:
        kd = rdma // d
        if kd < k:
            k = kd
    if c > 0:
        kc = int((cpu + EPS) // c)
        if kc < k:
            k = kc
    if m > 0:
        km = int(mem // m)
        if km < k:
            k = km
    return k if k > 0 else 0


class Cluster:
    """Free resources of every node, and the bucket index of the schedulable ones."""

    def __init__(self, nodes: Sequence[NodeSnap]) -> None:
        unique = {node.name: node for node in nodes}
        ordered = [unique[name] for name in sorted(unique)]
        self.names: list[str] = [node.name for node in ordered]
        self.index_of: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.node_model: list[str] = [node.gpu_model for node in ordered]
        self.total_gpus: list[int] = [node.gpus if node.gpus > 0 else 0 for node in ordered]
        self.total_cpu: list[float] = [
            float(node.cpu_cores) if node.cpu_cores > 0 else UNTRACKED for node in ordered
        ]
        self.total_mem: list[float] = [
            float(node.memory_mib) if node.memory_mib > 0 else UNTRACKED for node in ordered
        ]
        # RDMA devices are counted like GPUs: a node that offers none holds no replica asking.
        self.total_rdma: list[int] = [node.rdma if node.rdma > 0 else 0 for node in ordered]
        self.free_gpus: list[int] = list(self.total_gpus)
        self.free_rdma: list[int] = list(self.total_rdma)
        self.free_cpu: list[float] = list(self.total_cpu)
        self.free_mem: list[float] = list(self.total_mem)
        self.schedulable: list[bool] = [node.schedulable for node in ordered]
        self.in_index: list[bool] = [False] * len(ordered)
        self.reserved_for: dict[int, int] = {}
        self.models: frozenset[str] = frozenset(self.node_model)
        self.top = max(self.total_gpus, default=0)
        # model -> buckets[free GPUs] -> sorted node numbers; "" holds every schedulable node.
        self._buckets: dict[str, list[list[int]]] = {}
        self._member: list[tuple[list[list[int]], ...]] = []
        # Node kinds (gpus, cpu, mem, rdma) -> count, per model ("" = all): what could ever fit.
        self._kinds: dict[str, Counter[tuple[int, float, float, int]]] = {"": Counter()}
        kinds = Counter(
            zip(self.node_model, self.total_gpus, self.total_cpu, self.total_mem,
                self.total_rdma, strict=True)
        )
        for (model, gpus, cpu, mem, rdma), count in kinds.items():
            self._kinds[""][(gpus, cpu, mem, rdma)] += count
            if model:
                self._kinds.setdefault(model, Counter())[(gpus, cpu, mem, rdma)] += count

    # -- building ---------------------------------------------------------------------------

    def take(self, node: int, gpus: int, cpu: float, mem: int, rdma: int = 0) -> None:
        """Account one running replica before the index is built."""
        self.free_gpus[node] -= gpus
        self.free_cpu[node] -= cpu
        self.free_mem[node] -= mem
        if rdma:
            self.free_rdma[node] -= rdma

    def build_index(self) -> None:
        size = self.top + 1
        every = self._buckets.setdefault("", [[] for _ in range(size)])
        for model in self.models:
            if model:
                self._buckets[model] = [[] for _ in range(size)]
        member: dict[str, tuple[list[list[int]], ...]] = {"": (every,)}
        for model in self.models:
            if model:
                member[model] = (every, self._buckets[model])
        self._member = [member[model] for model in self.node_model]
        top, in_index = self.top, self.in_index
        for i, (lists, free, schedulable) in enumerate(
            zip(self._member, self.free_gpus, self.schedulable, strict=True)
        ):
            if schedulable:
                key = free if 0 <= free <= top else (0 if free < 0 else top)
                for buckets in lists:
                    buckets[key].append(i)  # i ascends, so each bucket stays sorted
                in_index[i] = True

    def _key(self, free: int) -> int:
        return free if 0 <= free <= self.top else (0 if free < 0 else self.top)

    def _move(self, node: int, before: int, after: int) -> None:
        """Node `node` went from `before` to `after` free GPUs: move it between buckets."""
        top = self.top
        old = before if 0 <= before <= top else (0 if before < 0 else top)
        new = after if 0 <= after <= top else (0 if after < 0 else top)
        if old == new or not self.in_index[node]:
            return
        for buckets in self._member[node]:
            bucket = buckets[old]
            del bucket[bisect_left(bucket, node)]
            insort(buckets[new], node)

    # -- changes ------------------------------------------------------------------------------

    def commit(self, picked: Picked, shape: Shape) -> tuple[str, ...]:
        """Place the replicas; returns the node name of each replica."""
        g, c, m, d = shape[1], shape[3], shape[4], shape[6]
        free_gpus, names = self.free_gpus, self.names
        if len(picked) == 1:
            node, count = picked[0]
            before = free_gpus[node]
            free_gpus[node] = before - g * count
            self.free_cpu[node] -= c * count
            self.free_mem[node] -= m * count
            if d:
                self.free_rdma[node] -= d * count
            self._move(node, before, before - g * count)
            return (names[node],) * count
        placement: list[str] = []
        for node, count in picked:
            before = free_gpus[node]
            free_gpus[node] = before - g * count
            self.free_cpu[node] -= c * count
            self.free_mem[node] -= m * count
            if d:
                self.free_rdma[node] -= d * count
            self._move(node, before, before - g * count)
            placement.extend([names[node]] * count)
        return tuple(placement)

    def release(self, node: int, gpus: int, cpu: float, mem: int, rdma: int = 0) -> None:
        before = self.free_gpus[node]
        self.free_gpus[node] = before + gpus
        self.free_cpu[node] += cpu
        self.free_mem[node] += mem
        if rdma:
            self.free_rdma[node] += rdma
        self._move(node, before, before + gpus)

    def reserve(self, nodes: Iterable[int], job_id: int) -> None:
        """Take nodes out of the index: nothing else starts there this cycle."""
        for node in nodes:
            if self.in_index[node]:
                key = self._key(self.free_gpus[node])
                for buckets in self._member[node]:
                    bucket = buckets[key]
                    del bucket[bisect_left(bucket, node)]
                self.in_index[node] = False
            self.reserved_for[node] = job_id

    # -- questions ----------------------------------------------------------------------------

    def eligible(
        self, node: int, model: str, excluded: frozenset[str], allowed: frozenset[str] | None
    ) -> bool:
        """May a replica of this job go on this node now (ignoring its free resources)?"""
        if not self.in_index[node]:
            return False
        if model and self.node_model[node] != model:
            return False
        if allowed is not None and self.node_model[node] not in allowed:
            return False
        return not (excluded and self.names[node] in excluded)

    def place(self, shape: Shape, allowed: frozenset[str] | None) -> Picked | None:
        """Best fit: replicas go on the schedulable nodes with the fewest free GPUs that still
        hold them (ties by name); a node takes as many replicas of the gang as fit. Returns None
        unless every replica has a place. Nothing changes until `commit`."""
        model, g, r, c, m, excluded, d = shape
        buckets = self._buckets.get(model)
        if buckets is None or r <= 0:
            return None
        free_cpu, free_mem, free_rdma = self.free_cpu, self.free_mem, self.free_rdma
        names, node_model = self.names, self.node_model
        picked: Picked = []
        need = r
        for free in range(g, len(buckets)):
            bucket = buckets[free]
            if not bucket:
                continue
            by_gpus = free // g if g > 0 else need
            for node in bucket:
                if excluded and names[node] in excluded:
                    continue
                if allowed is not None and node_model[node] not in allowed:
                    continue
                k = by_gpus
                if c > 0:
                    kc = int((free_cpu[node] + EPS) // c)
                    if kc < k:
                        k = kc
                if m > 0:
                    km = int(free_mem[node] // m)
                    if km < k:
                        k = km
                if d > 0:
                    kd = free_rdma[node] // d
                    if kd < k:
                        k = kd
                if k <= 0:
                    continue
                if k >= need:
                    picked.append((node, need))
                    return picked
                picked.append((node, k))
                need -= k
        return None

    def nodes_with(self, model: str, gpus: int) -> Iterable[int]:
        """Schedulable, unreserved nodes of the model with at least `gpus` free GPUs."""
        buckets = self._buckets.get(model)
        if buckets is None:
            return
        for free in range(max(gpus, 0), len(buckets)):
            yield from buckets[free]

    def slots_now(self, shape: Shape, allowed: frozenset[str] | None) -> int:
        """Replicas of this shape the free capacity holds now, all eligible nodes together."""
        total = 0
        model, g, excluded = shape[0], shape[1], shape[5]
        for node in self.nodes_with(model, g):
            if self.eligible(node, model, excluded, allowed):
                total += replicas_fitting(
                    self.free_gpus[node], self.free_cpu[node], self.free_mem[node],
                    self.free_rdma[node], shape
                )
        return total

    def looked_at(self, shape: Shape) -> list[int]:
        """The nodes a replica of this shape may go on now (schedulable, unreserved, of its
        model, not excluded), whatever they have free."""
        model, excluded = shape[0], shape[5]
        return sorted(n for n in self.nodes_with(model, 0)
                      if not (excluded and self.names[n] in excluded))

    def short_on(self, node: int, shape: Shape) -> list[tuple[str, float, float]]:
        """What one replica asks that the node lacks now: (resource, asked, free), GPUs, CPU
        cores, memory, RDMA devices in that order (see `reasons`)."""
        g, c, m, d = shape[1], shape[3], shape[4], shape[6]
        short: list[tuple[str, float, float]] = []
        if g > 0 and self.free_gpus[node] < g:
            short.append(("gpu", g, self.free_gpus[node]))
        if c > 0 and self.free_cpu[node] + EPS < c:
            short.append(("cpu", c, self.free_cpu[node]))
        if m > 0 and self.free_mem[node] < m:
            short.append(("memory", m, self.free_mem[node]))
        if d > 0 and self.free_rdma[node] < d:
            short.append(("rdma", d, self.free_rdma[node]))
        return short

    def count_looked_at(self, shape: Shape) -> int:
        """len(looked_at(shape)), without listing them."""
        model, excluded = shape[0], shape[5]
        buckets = self._buckets.get(model)
        if buckets is None:
            return 0
        count = sum(len(bucket) for bucket in buckets)
        for name in excluded:
            node = self.index_of.get(name)
            if node is not None and self.in_index[node] and (
                    not model or self.node_model[node] == model):
                count -= 1
        return count

    def closest(self, shape: Shape) -> tuple[int, int]:
        """The node a replica may go on now (`looked_at`) that comes closest to holding it: the
        fewest resources short, then the largest share of the scarcest one free, then by name;
        and how many such nodes there are. (-1, 0) when there are none. It walks the buckets
        from the most free GPUs down and stops at the first node short of GPUs alone: no node
        after it comes closer (this runs once per shape that waits, on clusters of thousands of
        nodes)."""
        model, g, c, m, excluded = shape[0], shape[1], shape[3], shape[4], shape[5]
        d = shape[6]
        count = self.count_looked_at(shape)
        if count <= 0:
            return -1, 0
        buckets, names = self._buckets[model], self.names
        free_cpu, free_mem, free_rdma = self.free_cpu, self.free_mem, self.free_rdma
        best: tuple[int, float, int] | None = None
        for free in range(len(buckets) - 1, -1, -1):
            bucket = buckets[free]
            if not bucket:
                continue
            gpu_share = min(1.0, free / g) if g > 0 else 1.0
            for node in bucket:
                if excluded and names[node] in excluded:
                    continue
                short, share = (1, gpu_share) if gpu_share < 1.0 else (0, 1.0)
                if c > 0 and free_cpu[node] + EPS < c:
                    short += 1
                    share = min(share, max(free_cpu[node], 0.0) / c)
                if m > 0 and free_mem[node] < m:
                    short += 1
                    share = min(share, max(free_mem[node], 0.0) / m)
                if d > 0 and free_rdma[node] < d:
                    short += 1
                    share = min(share, max(free_rdma[node], 0) / d)
                key = (short, -share, node)
                if best is None or key < best:
                    best = key
                if short == 0 or (short == 1 and gpu_share < 1.0 and share == gpu_share):
                    return best[2], count
        return (best[2], count) if best is not None else (-1, 0)

    def gang_short(self, nodes: Sequence[int], shape: Shape) -> tuple[list[str], int]:
        """For a gang its free GPUs would hold: the resources that each alone leave room for
        fewer than all its replicas on `nodes`, and the replicas all of them hold together."""
        r, c, m, d = shape[2], shape[3], shape[4], shape[6]
        short: list[str] = []
        resources: tuple[tuple[str, Sequence[float], float], ...] = (
            ("cpu", self.free_cpu, c), ("memory", self.free_mem, m), ("rdma", self.free_rdma, d))
        for what, free, ask in resources:
            if ask > 0 and sum(int((max(free[n], 0.0) + EPS) // ask) for n in nodes) < r:
                short.append(what)
        room = sum(replicas_fitting(self.free_gpus[n], self.free_cpu[n], self.free_mem[n],
                                    self.free_rdma[n], shape)
                   for n in nodes)
        if not short:  # each alone would do, not all together
            short = [what for what, _, ask in resources if ask > 0]
        return short, room

    def largest_free(
        self, model: str, excluded: frozenset[str], allowed: frozenset[str] | None
    ) -> int:
        buckets = self._buckets.get(model)
        if buckets is None:
            return 0
        for free in range(len(buckets) - 1, -1, -1):
            for node in buckets[free]:
                if self.eligible(node, model, excluded, allowed):
                    return free
        return 0

    def gpu_slots(
        self, model: str, gpus: int, excluded: frozenset[str], allowed: frozenset[str] | None
    ) -> int:
        """Replicas of `gpus` GPUs the free GPUs hold (CPU and memory aside)."""
        buckets = self._buckets.get(model)
        if buckets is None or gpus <= 0:
            return 0
        total = 0
        for free in range(gpus, len(buckets)):
            bucket = buckets[free]
            if excluded or allowed is not None:
                count = sum(1 for n in bucket if self.eligible(n, model, excluded, allowed))
            else:
                count = len(bucket)
            total += count * (free // gpus)
        return total

    def max_gpus(self, model: str) -> int:
        kinds = self._kinds.get(model)
        return max((kind[0] for kind in kinds), default=0) if kinds else 0

    def slots_ever(self, shape: Shape) -> int:
        """Replicas of this shape the whole cluster holds when empty (cordoned nodes too)."""
        kinds = self._kinds.get(shape[0])
        if not kinds:
            return 0
        return sum(replicas_fitting(g, c, m, d, shape) * n for (g, c, m, d), n in kinds.items())

    def total_gpus_of(self, model: str) -> int:
        kinds = self._kinds.get(model)
        return sum(kind[0] * n for kind, n in kinds.items()) if kinds else 0

    def slots_ever_without_excluded(self, shape: Shape) -> int:
        """Like `slots_ever`, leaving out the nodes the job must avoid."""
        total = self.slots_ever(shape)
        for name in shape[5]:
            node = self.index_of.get(name)
            if node is not None and (not shape[0] or self.node_model[node] == shape[0]):
                total -= replicas_fitting(
                    self.total_gpus[node], self.total_cpu[node], self.total_mem[node],
                    self.total_rdma[node], shape
                )
        return total

    def pick_reservation(
        self, shape: Shape, allowed: frozenset[str] | None, biggest_running: Sequence[int]
    ) -> list[int] | None:
        """The nodes that would hold this job soonest by GPU count: the most free GPUs first,
        then those whose running replicas are smallest; just enough of them for the gang once
        they drain. None if the unreserved nodes cannot hold it."""
        model, excluded = shape[0], shape[5]
        buckets = self._buckets.get(model)
        if buckets is None:
            return None
        chosen: list[int] = []
        room = 0
        for free in range(len(buckets) - 1, -1, -1):
            bucket = [
                node
                for node in buckets[free]
                if (allowed is None or self.node_model[node] in allowed)
                and not (excluded and self.names[node] in excluded)
            ]
            bucket.sort(key=lambda n: (biggest_running[n], n))
            for node in bucket:
                holds = replicas_fitting(
                    self.total_gpus[node], self.total_cpu[node], self.total_mem[node],
                    self.total_rdma[node], shape
                )
                if holds > 0:
                    chosen.append(node)
                    room += holds
                    if room >= shape[2]:
                        return chosen
        return None
