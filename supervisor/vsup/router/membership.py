"""Which instances the router routes to, from vsup's view of them.

Only a `ready` instance is a worker. Every other state (starting, unhealthy, backoff, stopping,
stopped, failed, and a drain that the engine marks before it stops one) leaves the set: the
engine calls `leave` before it touches an instance, so the router sends it no new request while
its running ones finish, and `reconcile` after each state change. Pure except `reconcile`,
which talks to the router through a `RouterClient`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vsup.router.client import RouterClient
from vsup.states import State

# What the engine reports for a ready instance that must get no request (a stalled engine).
EXCLUDED = "excluded"


@dataclass(frozen=True)
class ForeignWorker:
    """A worker someone else added to the router, as vsup found and removed it."""

    url: str
    first_seen: str  # ISO-8601 UTC of the first removal of this incident
    last_seen: str  # and of the latest
    removals: int  # how often vsup removed it (it comes back while something re-adds it)
    last_seen_mono: float  # the clock's monotonic seconds of the latest removal
    router_host: str  # the address the router listens on (what let it in)
    router_port: int
    # other local users connected to the router's port when vsup found it (router/peers.py)
    users: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "removals": self.removals,
            "users": list(self.users),
        }


@dataclass(frozen=True)
class RemovedWorker:
    """A member someone else removed from the router (`POST /remove_worker`), as vsup found it
    missing and put it back."""

    url: str
    name: str  # the instance it is
    first_seen: str  # ISO-8601 UTC of the first restore of this incident
    last_seen: str  # and of the latest
    restores: int  # how often vsup put it back (a remove loop takes it out again and again)
    last_seen_mono: float
    router_host: str
    router_port: int
    users: tuple[str, ...] = ()  # other local users connected to the router's port then

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "name": self.name,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "restores": self.restores,
            "users": list(self.users),
        }


@dataclass(frozen=True)
class MembershipChange:
    """Worker URLs to add and to remove (removals go first)."""

    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.remove)


class RouterMembership:
    """The worker set for one router. `workers` maps instance name -> worker URL, `models`
    instance name -> the model it serves (what requests name), `standins` model -> the URL of
    its holder (router/holder.py: wake on request), for the models that have one."""

    def __init__(
        self,
        workers: Mapping[str, str],
        models: Mapping[str, str] | None = None,
        standins: Mapping[str, str] | None = None,
    ):
        self.workers = dict(workers)
        self.models = dict(models or {})
        self.standins = dict(standins or {})
        self._leaving: set[str] = set()

    def with_workers(
        self, workers: Mapping[str, str], models: Mapping[str, str] | None = None
    ) -> RouterMembership:
        """The same membership over a new layout's members (instances still leaving stay out)."""
        new = RouterMembership(workers, models, self.standins)
        new._leaving = {n for n in self._leaving if n in new.workers}
        return new

    def desired(self, states: Mapping[str, str]) -> list[str]:
        """URLs of the member instances that are ready and not leaving, in layout order; then,
        for each model with a holder and none of those, its holder."""
        ready = [
            name
            for name in self.workers
            if states.get(name) == State.READY and name not in self._leaving
        ]
        served = {self.models.get(n) for n in ready}
        return [self.workers[n] for n in ready] + [
            url for model, url in self.standins.items() if model not in served
        ]

    def plan(self, states: Mapping[str, str], current: Iterable[str]) -> MembershipChange:
        """What to add and remove so the router's `current` workers match `states`. A URL vsup
        did not put there (added by hand through the router's API) is removed too: vsup owns
        this router's worker set."""
        want = self.desired(states)
        have = list(dict.fromkeys(current))
        return MembershipChange(
            add=tuple(u for u in want if u not in have),
            remove=tuple(u for u in have if u not in want),
        )

    def foreign(self, urls: Iterable[str]) -> tuple[str, ...]:
        """The URLs in `urls` that are no member's: workers someone else added through the
        router's API (which has no authentication), to be removed at once."""
        mine = set(self.workers.values()) | set(self.standins.values())
        return tuple(u for u in dict.fromkeys(urls) if u not in mine)

    def taken(
        self, states: Mapping[str, str], placed: Iterable[str], current: Iterable[str]
    ) -> tuple[str, ...]:
        """Members vsup wants and put in the router (`placed`) that are no longer in its
        `current` list: someone else removed them through the open worker API (vsup removes a
        member only after `leave` or a state change has taken it out of `desired`)."""
        have, placed = set(current), set(placed)
        return tuple(u for u in self.desired(states) if u in placed and u not in have)

    def name_of(self, url: str) -> str | None:
        name = next((n for n, u in self.workers.items() if u == url), None)
        if name is None:
            name = next((f"hold:{m}" for m, u in self.standins.items() if u == url), None)
        return name

    def leave(self, name: str) -> str | None:
        """Mark `name` as leaving (a drain, stop or restart is about to start): it stays out
        of the set until `rejoin`, whatever its state. Returns its URL, None if not a member."""
        if name not in self.workers:
            return None
        self._leaving.add(name)
        return self.workers[name]

    def rejoin(self, name: str) -> None:
        """`name` may be a worker again once it is ready (after its restart, say)."""
        self._leaving.discard(name)

    async def reconcile(self, client: RouterClient, states: Mapping[str, str]) -> MembershipChange:
        """Read the router's workers and make them match `states`; returns what it changed.
        Raises `RouterError` when the router does not answer (the caller retries later)."""
        change = self.plan(states, await client.list_workers())
        for url in change.remove:
            await client.remove_worker(url)
        for url in change.add:
            await client.add_worker(url)
        return change
