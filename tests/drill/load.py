"""The load of the drill: tenants submitting tasks and runtimes heartbeating and completing
their leases through Berth's HTTP API, recording every answer with its wall-clock time."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

TASK = {
    "runtimeClass": "gpu-small",
    "requests": {"cpuMillis": 100, "memoryMiB": 128, "llmSlots": 0},
    "labels": {"app": "drill"},
}

#: The kinds of request that write to the ledger.
WRITES = ("submit", "heartbeat", "complete")


@dataclass
class Answer:
    """One request: when it was sent and answered (wall clock), what and how."""

    at: float
    kind: str
    status: int | None  # None: no HTTP answer (the client's connection failed)
    error: str | None = None
    sent: float = 0.0


@dataclass
class Load:
    """Clients and runtimes spread over the APIs of ``bases``; everything they saw."""

    bases: tuple[str, ...]
    tenant_key: str
    runtime_keys: dict[str, str]
    clients: int = 4
    answers: list[Answer] = field(default_factory=list)
    acknowledged: set[str] = field(default_factory=set)
    leases_seen: dict[str, float] = field(default_factory=dict)  # lease id -> first seen
    completed: set[str] = field(default_factory=set)
    readiness: list[tuple[float, int | None, str]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> None:
        """Start the clients and the runtimes as tasks of the running loop."""
        n = len(self.bases)
        self._tasks = [asyncio.ensure_future(self._client(self.bases[i % n]))
                       for i in range(self.clients)]
        self._tasks += [asyncio.ensure_future(self._runtime(rt, key, self.bases[i % n]))
                        for i, (rt, key) in enumerate(self.runtime_keys.items())]
        self._tasks += [asyncio.ensure_future(self._probe(base)) for base in self.bases]

    async def stop(self) -> None:
        """Stop every client and runtime after its current request."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def _record(self, kind: str, sent: float, response: httpx.Response | None,
                error: str | None = None) -> None:
        status = None if response is None else response.status_code
        self.answers.append(Answer(time.time(), kind, status, error, sent))

    async def _call(self, http: httpx.AsyncClient, kind: str, method: str, url: str,
                    **kw: object) -> httpx.Response | None:
        sent = time.time()
        try:
            response = await http.request(method, url, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as exc:
            self._record(kind, sent, None, type(exc).__name__)
            await asyncio.sleep(0.2)
            return None
        self._record(kind, sent, response)
        if response.status_code == 503:
            retry = float(response.headers.get("retry-after", "1"))
            # A hurried client, to measure the window (and when Berth answers again) closely.
            await asyncio.sleep(min(retry, 0.2))
        return response

    async def _client(self, base: str) -> None:
        headers = {"Authorization": f"Bearer {self.tenant_key}"}
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            while not self._stop.is_set():
                r = await self._call(http, "submit", "POST", "/v1/tasks", json=TASK,
                                     headers=headers)
                if r is not None and r.status_code == 201:
                    self.acknowledged.add(r.json()["id"])
                await asyncio.sleep(0.05)

    async def _runtime(self, instance: str, key: str, base: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            while not self._stop.is_set():
                await self._call(http, "heartbeat", "POST", f"/v1/runtimes/{instance}/heartbeat",
                                 headers=headers)
                r = await self._call(http, "leases", "GET", f"/v1/runtimes/{instance}/leases",
                                     headers=headers)
                items = r.json()["items"] if r is not None and r.status_code == 200 else []
                for lease in items:
                    self.leases_seen.setdefault(lease["id"], time.time())
                    if lease["id"] in self.completed:
                        continue
                    done = await self._call(
                        http, "complete", "POST", f"/v1/leases/{lease['id']}/complete",
                        json={"outcome": "succeeded", "epoch": lease["epoch"]}, headers=headers,
                    )
                    if done is not None and done.status_code == 200:
                        self.completed.add(lease["id"])
                await asyncio.sleep(0.2)

    async def _probe(self, base: str) -> None:
        """Ask /readyz twice a second, as a Kubernetes readiness probe would."""
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            while not self._stop.is_set():
                try:
                    r = await http.get("/readyz")
                    detail = r.json().get("detail", "") if r.status_code != 200 else ""
                    self.readiness.append((time.time(), r.status_code, detail))
                except httpx.HTTPError as exc:
                    self.readiness.append((time.time(), None, type(exc).__name__))
                await asyncio.sleep(0.5)

    # --- what it saw ----------------------------------------------------------------------

    def statuses(self, since: float = 0.0) -> Counter[str]:
        """Return how many answers of each status (or error name) came after ``since``."""
        return Counter(str(a.status if a.status is not None else a.error)
                       for a in self.answers if a.at >= since)

    def unavailable_window(self, since: float) -> tuple[float, float] | None:
        """Return (first, last) time of a 503 or failed connection after ``since``."""
        times = [a.at for a in self.answers
                 if a.at >= since and (a.status == 503 or a.status is None)]
        return (min(times), max(times)) if times else None

    def first_write_answered(self, since: float) -> Answer | None:
        """Return the first write (submit, heartbeat, completion) sent after ``since`` and
        answered 2xx."""
        answers = [a for a in self.answers if a.sent >= since and a.status is not None
                   and 200 <= a.status < 300 and a.kind in WRITES]
        return min(answers, key=lambda a: a.at) if answers else None

    def first_lease_after(self, since: float) -> float | None:
        """Return when a runtime first saw a lease it had not seen before ``since``."""
        times = [t for t in self.leases_seen.values() if t >= since]
        return min(times) if times else None
