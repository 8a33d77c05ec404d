"""The seat's Ray Serve request router: route_policy.choose over Ray's replicas (imports ray).

Ray Serve runs one in every process holding a handle to the seat deployment: the ingress's. Each
request's RouteKey is its call's first argument (ray_ingress.py puts it there). A replica's load is Ray's
own count of its requests in flight (the router's queue-length cache, probed when stale); the models it
holds come from its routing stats (``SeatReplica.record_routing_stats``: the residency pool's resident
models, reported every ROUTING_STATS_PERIOD_S), and the book remembers what this router sent since.

Why not Ray Serve's model multiplexing: its replicas keep at most ``max_num_models_per_replica`` models,
evicting by count, while a seat's residency pool evicts by bytes under the registry's budget (a replica
may hold three small models or one large one); its router knows models only, not prompts or the
bound. A custom router sees the whole key and reads residency from the pool itself.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from nxctl.server.route_keys import RouteKey
from nxctl.server.route_policy import LOAD_BOUND, ReplicaView, RouteBook, choose, round_robin

ROUTING_STATS_PERIOD_S = 1.0
ROUTER_PATH = "nxctl.server.ray_router.SeatRouter"


def key_of(request: PendingRequest | None) -> RouteKey | None:
    """The request's RouteKey (its first argument), None for calls that carry none."""
    if request is None or not request.args or not isinstance(request.args[0], RouteKey):
        return None
    return request.args[0]


class SeatRouter(RequestRouter):
    """Ranks the replicas for each request with route_policy.choose (Ray then takes the first of a rank
    whose queue is not full, and backs off when none is)."""

    def initialize_state(self, load_bound: int = LOAD_BOUND, round_robin: bool = False, **_: Any) -> None:
        """Ray calls this once with the deployment's ``request_router_kwargs``."""
        self.load_bound = load_bound
        self.round_robin = round_robin  # the fault route-round-robin: a negative control
        self.book = RouteBook()
        self.turn = 0

    async def _loads(self, replicas: list[RunningReplica]) -> dict[ReplicaID, int]:
        """Requests in flight per replica: Ray's cache, the stale ones probed (unanswered: 0)."""
        cache = self.replica_queue_len_cache
        loads = {r.replica_id: cache.get(r.replica_id) for r in replicas}
        stale = [r for r in replicas if loads[r.replica_id] is None]
        if stale:
            # Ray's own probe (as its prefix-aware router does): it also refreshes the cache
            for replica, length in await self._probe_queue_lens(stale, 0):
                loads[replica.replica_id] = length
        return {rid: n or 0 for rid, n in loads.items()}

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        """Ranks for the request: the chosen replica alone, then the others in order of preference."""
        key = key_of(pending_request)
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        if key is None:
            return [candidate_replicas]
        if key.roster is not None:  # the ingress asks who is there (for /metrics): any replica answers
            key.roster[:] = sorted(r.replica_id.unique_id for r in candidate_replicas)
            return [candidate_replicas]
        if key.replica is not None:
            return [[r for r in candidate_replicas if r.replica_id.unique_id == key.replica]]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        loads = await self._loads(candidate_replicas)
        views = [
            ReplicaView(rid, loads[r.replica_id], frozenset((r.routing_stats or {}).get("models", ())))
            for rid, r in by_id.items()
        ]
        if self.round_robin:
            self.turn += 1
            ranked = round_robin(views, self.turn)
        else:
            ranked = choose(views, key, self.book, self.load_bound)
        # Ray sends to the first rank's replica unless its queue is full (max_ongoing_requests): its
        # on_request_routed hook runs only on the strict-queue path, so the book records the choice here
        self.book.record(ranked[0].id, key)
        return [[by_id[ranked[0].id]], [by_id[v.id] for v in ranked[1:]]]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """Forget a dead replica."""
        super().on_replica_actor_died(replica_id)
        self.book.forget(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Ray's new replica set; the book forgets the replicas gone from it."""
        before = {r.unique_id for r in self.curr_replicas}
        super().update_replicas(replicas)
        for gone in before - {r.replica_id.unique_id for r in replicas}:
            self.book.forget(gone)
