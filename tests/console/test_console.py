"""The console in a real browser: each role signs in with its key and sees what the API lets
it see — a waiting task's closest miss and position, a placed task's score components, a
pool's utilization, a drain with its preview — and never another tenant's data; whatever a
user wrote shows as text."""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.async_api import Page, expect

from tests.api.conftest import TENANT_A, Keys, pool_body
from tests.console.conftest import screenshot_path

SCRIPT = "<script>window.__pwned = 1</script>"
REQUESTS = {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1}
ONE_TASK = {"cpuMillis": 1000, "memoryMiB": 1024, "llmSlots": 1}
FOUR_TASKS = {"cpuMillis": 4000, "memoryMiB": 4096, "llmSlots": 4}


async def sign_in(page: Page, server: str, key: str, role: str) -> None:
    """Open the console and sign in with ``key`` using the keyboard only."""
    await page.goto(f"{server}/console/")
    await page.locator("#key").focus()
    await page.keyboard.type(key)
    await page.keyboard.press("Enter")
    await expect(page.locator("#who")).to_contain_text(f"Signed in as {role}")
    # The first page is in (it takes the focus: wait for it before pressing keys).
    await expect(page.locator("#view h1")).to_be_visible()


class Api:
    """The public API, as the tests' other clients (admin, runtime, tenants) use it."""

    def __init__(self, http: httpx.AsyncClient, keys: Keys) -> None:
        self.http = http
        self.keys = keys

    async def call(self, method: str, path: str, who: str, body: Any = None) -> Any:
        response = await self.http.request(method, path, json=body, headers=self.keys[who])
        assert response.status_code < 300, response.text
        return response.json() if response.content else None

    async def pool(self, pool_id: str, capacity: dict[str, int], **fields: Any) -> None:
        await self.call("POST", "/v1/pools", "admin", pool_body(pool_id, **fields))
        await self.call("PUT", f"/v1/pools/{pool_id}/capacity", "admin", capacity)

    async def submit(self, who: str = "tenant_a", **spec: Any) -> str:
        body = {"runtimeClass": "gpu-small", "requests": REQUESTS, **spec}
        return (await self.call("POST", "/v1/tasks", who, body))["id"]


async def api_of(server: str, keys: Keys) -> tuple[httpx.AsyncClient, Api]:
    http = httpx.AsyncClient(base_url=server, timeout=30)
    return http, Api(http, keys)


async def test_a_tenant_sees_why_its_task_waits_and_how_a_placed_one_scored(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    http, api = await api_of(server, keys)
    async with http:
        await api.pool("pool-x", ONE_TASK)
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        placed = await api.submit(labels={"app": SCRIPT})
        waiting = await api.submit()
        assert (await reconcile()).leased == 1
        pending = await api.call("GET", f"/v1/tasks/{waiting}", "tenant_a")
        components = (await api.call("GET", f"/v1/tasks/{placed}", "tenant_a"))["placement"][
            "components"]

    await sign_in(page, server, keys.raw["tenant_a"], "tenant")

    # The queue: the waiting task by runtime class and reason, with its position.
    row = page.locator(f'tr[data-task="{waiting}"]')
    await expect(row).to_contain_text(pending["pendingReason"]["code"])
    await expect(row).to_contain_text("gpu-small")
    await expect(row).to_contain_text(f"{pending['queue']['position']} of")
    await expect(page.locator("table").first).to_contain_text(pending["pendingReason"]["code"])
    await page.screenshot(path=screenshot_path("queue"), full_page=True)

    # Its page: the closest miss, the position, the pools rejected by reason.
    await row.get_by_role("link").click()
    await expect(page.locator(".closest")).to_contain_text(pending["pendingReason"]["code"])
    await expect(page.locator(".closest")).to_contain_text(pending["pendingReason"]["message"])
    await expect(page.locator("[data-position]")).to_contain_text(
        f"{pending['queue']['position']} of"
    )
    await expect(page.locator(".timeline")).to_contain_text("submitted")

    # The placed task: every score component of its decision, its lease, its label as text.
    await page.goto(f"{server}/console/#/tasks/{placed}")
    for component in components:
        cell = page.locator(f'tr[data-component="{component["name"]}"]')
        await expect(cell).to_contain_text(f"{component['value']:.1f}")
        await expect(cell).to_contain_text(component["reason"])
    # Every pool now, by the same pipeline: pool-x is full, so it is rejected, by reason.
    await expect(page.locator("tr[data-rejection]").first).to_contain_text("pool-x")
    await expect(page.get_by_role("heading", name="Lease", exact=True)).to_be_visible()
    await expect(page.locator(".labels").first).to_contain_text(f"app={SCRIPT}")
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("script").count() == 1
    await page.screenshot(path=screenshot_path("task"), full_page=True)


async def test_an_operator_sees_utilization_and_drains_after_the_preview(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    http, api = await api_of(server, keys)
    async with http:
        await api.pool("pool-x", FOUR_TASKS, labels={"tier": SCRIPT})
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        task = await api.submit()
        assert (await reconcile()).leased == 1
        await api.pool("pool-y", ONE_TASK, failureDomain="fd-2")
        await api.call("POST", "/v1/pools/pool-y/cordon", "operator_x",
                       {"reason": f"disk swap {SCRIPT}"})

        await sign_in(page, server, keys.raw["operator_x"], "operator")
        await page.get_by_role("link", name="Pools").click()
        card = page.locator('article[data-pool="pool-x"]')
        await expect(card.locator('[data-util="cpuMillis"]')).to_have_text("1 core / 4 cores")
        await expect(card.locator('[data-util="llmSlots"]')).to_have_text("1 / 4")
        await expect(card).to_contain_text("healthy")
        await expect(card).to_contain_text(f"tier={SCRIPT}")
        await expect(page.locator('article[data-pool="pool-y"] .status-reason')).to_have_text(
            f"Reason: disk swap {SCRIPT}")
        await page.screenshot(path=screenshot_path("pools"), full_page=True)

        # The preview comes first: pool-y is cordoned, so the task would wait.
        await card.get_by_role("button", name="Drain…").click()
        dialog = page.locator("dialog[open]")
        await expect(dialog.locator('[data-summary="drain"]')).to_have_text(
            "1 live lease(s): 0 would move, 1 would wait.")
        await expect(dialog).to_contain_text("pool_not_active")
        await dialog.get_by_role("button", name="Cancel").click()
        await expect(page.locator("dialog[open]")).to_have_count(0)

        # Activate pool-y from the console: now the preview moves the task there.
        await page.locator('article[data-pool="pool-y"]').get_by_role(
            "button", name="Activate").click()
        await page.locator("dialog[open]").get_by_role("button", name="Activate pool-y").click()
        await expect(page.locator('article[data-pool="pool-y"]')).to_contain_text("ACTIVE")
        await card.get_by_role("button", name="Drain…").click()
        dialog = page.locator("dialog[open]")
        await expect(dialog.locator('[data-summary="drain"]')).to_have_text(
            "1 live lease(s): 1 would move, 0 would wait.")
        await expect(dialog.locator("tr[data-lease]")).to_contain_text("pool-y")
        await page.locator("#action-reason").fill("decommission")
        await page.screenshot(path=screenshot_path("drain"), full_page=False)
        await dialog.get_by_role("button", name="Drain pool-x").click()

        await expect(card).to_contain_text("DRAINING")
        await expect(card.locator("[data-drain]")).to_contain_text("1 lease(s) left")
        pool = await api.call("GET", "/v1/pools/pool-x", "admin")
        assert pool["status"] == "DRAINING" and pool["statusReason"] == "decommission"
        assert (await api.call("GET", f"/v1/tasks/{task}", "tenant_a"))["state"] == "LEASED"


async def test_a_tenant_never_sees_another_tenants_data(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    http, api = await api_of(server, keys)
    async with http:
        await api.pool("pool-x", ONE_TASK, tenantIds=[TENANT_A], labels={"secret": "a-only"})
        await api.pool("pool-b", ONE_TASK, tenantIds=["tenant-b"], failureDomain="fd-2")
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        theirs = [await api.submit() for _ in range(2)]
        await reconcile()
        mine = await api.submit(who="tenant_b", requests={**REQUESTS, "cpuMillis": 99000})
        await reconcile()

    await sign_in(page, server, keys.raw["tenant_b"], "tenant")
    await expect(page.locator(f'tr[data-task="{mine}"]')).to_be_visible()
    queue_text = await page.locator("main").inner_text()
    assert not any(t in queue_text for t in theirs)
    await page.get_by_role("link", name="Pools").click()
    await expect(page.locator('article[data-pool="pool-b"]')).to_be_visible()
    await expect(page.locator('article[data-pool="pool-x"]')).to_have_count(0)
    assert "a-only" not in await page.locator("main").inner_text()

    # Another tenant's task, asked for by id: the API's 404, shown as its problem.
    await page.goto(f"{server}/console/#/tasks/{theirs[0]}")
    await expect(page.locator("#problem")).to_be_visible()
    problem = await page.locator("#problem").inner_text()
    assert re.search(r"not found", problem, re.IGNORECASE), problem
    assert theirs[0] not in await page.locator("main").inner_text()


async def test_every_role_signs_in_and_a_bad_key_shows_the_problem(
    server: str, keys: Keys, page: Page
) -> None:
    await page.goto(f"{server}/console/")
    await page.locator("#key").fill("berth_not-a-key-at-all-0000000000000000000")
    await page.locator("#key").press("Enter")
    await expect(page.locator("#problem")).to_be_visible()
    await expect(page.locator("#problem strong")).not_to_be_empty()
    await expect(page.locator("#signin")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0

    for name, role in (("admin", "admin"), ("operator_x", "operator"),
                       ("runtime_1", "runtime"), ("tenant_a", "tenant")):
        await sign_in(page, server, keys.raw[name], role)
        # The key is in this tab's session storage, never in the URL or a cookie.
        assert keys.raw[name] not in page.url
        assert await page.context.cookies() == []
        assert await page.evaluate("sessionStorage.getItem('berth.apiKey')") == keys.raw[name]
        # The pages are reachable with the keyboard alone.
        nav = page.get_by_role("link", name="Pools")
        await nav.focus()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("heading", name="Pools", level=1)).to_be_visible()
        await page.get_by_role("button", name="Sign out").click()
        await expect(page.locator("#signin")).to_be_visible()


async def test_the_drain_dialog_shows_the_summary_first_and_keeps_confirm_in_view(
    server: str, keys: Keys, browser: Any, reconcile: Any
) -> None:
    # 30 leases on pool-x; once it drains, pool-y takes 12 and pool-t (no operator: operator-x
    # cannot see it) 6; the other 12 wait.
    tasks = 30
    http, api = await api_of(server, keys)
    async with http:
        await api.pool("pool-x", {k: v * tasks for k, v in ONE_TASK.items()})
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        for _ in range(tasks):
            await api.submit()
        assert (await reconcile()).leased == tasks
        await api.pool("pool-y", {k: v * 12 for k, v in ONE_TASK.items()}, failureDomain="fd-2")
        await api.pool("pool-t", {k: v * 6 for k, v in ONE_TASK.items()}, failureDomain="fd-3",
                       costWeight=5.0, operators=[])
    context = await browser.new_context(viewport={"width": 1024, "height": 640})
    try:
        page = await context.new_page()
        await sign_in(page, server, keys.raw["operator_x"], "operator")
        await page.get_by_role("link", name="Pools").click()
        card = page.locator('article[data-pool="pool-x"]')
        await card.get_by_role("button", name="Drain…").click()
        dialog = page.locator("dialog[open]")
        summary = dialog.locator('[data-summary="drain"]')
        await expect(summary).to_have_text("30 live lease(s): 18 would move, 12 would wait.")
        await expect(dialog.locator('[data-destination="pool-y"]')).to_have_text(
            "pool-y: 12 lease(s)")
        await expect(dialog.locator('[data-destination=""]')).to_have_text(
            "Pools you cannot see: 6 lease(s)")
        await expect(dialog.locator('[data-waiting="insufficient_cpu"]')).to_contain_text(
            "12 lease(s)")
        await expect(dialog).not_to_contain_text("pool-t")
        # One page of leases, below the form in its own scrolling box.
        await expect(dialog.locator("tr[data-lease]")).to_have_count(20)
        await expect(dialog).to_contain_text("The first 20 leases (10 more)")
        confirm = dialog.get_by_role("button", name="Drain pool-x")
        await expect(confirm).to_be_enabled()
        await expect(summary).to_be_in_viewport()
        await expect(confirm).to_be_in_viewport()
        summary_box, confirm_box = await summary.bounding_box(), await confirm.bounding_box()
        assert summary_box and confirm_box and summary_box["y"] < confirm_box["y"]
        await confirm.click()
        await expect(card).to_contain_text("DRAINING")
    finally:
        await context.close()
