"""The console as a first user meets it: no navigation before signing in, each role landing on
a page it may read, a finished task's page that previews nothing, capacity in cores and GiB
with the unit said, and the queue readable on a 390 px wide phone."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, Request, expect

from tests.api.conftest import Keys
from tests.console.conftest import WAIT_MS, screenshot_path
from tests.console.test_console import ONE_TASK, api_of, sign_in

NAV = ("Queue", "Pools", "Tenants")
#: Each role's landing page (its h1) and the navigation links it sees.
LANDINGS = (
    ("admin", "admin", "Queue", NAV),
    ("runtime_1", "runtime", "Pools", ("Pools",)),
    ("operator_x", "operator", "Queue", ("Queue", "Pools")),
    ("tenant_a", "tenant", "Queue", NAV),
)


async def pool_and_tasks(
    server: str, keys: Keys, reconcile: Any, capacity: dict[str, int], *specs: dict[str, Any]
) -> list[str]:
    """Register pool-x with ``capacity``, send its runtime's heartbeat, submit one task of
    tenant-a per spec, run one reconciler pass; return the task ids."""
    http, api = await api_of(server, keys)
    async with http:
        await api.pool("pool-x", capacity)
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        ids = [await api.submit(**spec) for spec in specs]
    await reconcile()
    return ids


async def test_navigation_is_hidden_until_signed_in(server: str, keys: Keys, page: Page) -> None:
    await page.goto(f"{server}/console/")
    await expect(page.locator("#signin")).to_be_visible()
    await expect(page.locator("#nav")).to_be_hidden()
    await expect(page.get_by_role("link", name="Queue")).to_have_count(0)
    await expect(page.get_by_role("button", name="Sign out")).to_be_hidden()

    await sign_in(page, server, keys.raw["admin"], "admin")
    await expect(page.locator("#nav")).to_be_visible()
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.locator("#signin")).to_be_visible()
    await expect(page.locator("#nav")).to_be_hidden()


async def test_each_role_lands_on_a_page_it_may_read(server: str, keys: Keys, page: Page) -> None:
    # One tab, one key after another: each starts where the previous one left (#/queue first).
    for name, role, landing, links in LANDINGS:
        await sign_in(page, server, keys.raw[name], role)
        await expect(page.get_by_role("heading", level=1)).to_have_text(landing)
        await expect(page.locator("#problem")).to_be_hidden()
        assert page.url.endswith(f"#/{landing.lower()}")
        for link in NAV:
            shown = page.locator("#nav").get_by_role("link", name=link, exact=True)
            await (expect(shown).to_be_visible() if link in links else expect(shown).to_be_hidden())
        await page.get_by_role("button", name="Sign out").click()
        await expect(page.locator("#signin")).to_be_visible()

    # A runtime key sent to the queue by a link lands on Pools, not on a 403.
    await sign_in(page, server, keys.raw["runtime_1"], "runtime")
    await page.goto(f"{server}/console/#/queue")
    await expect(page.get_by_role("heading", level=1)).to_have_text("Pools")
    await expect(page.locator("#problem")).to_be_hidden()


async def test_a_finished_tasks_page_stops_previewing(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    done, running = await pool_and_tasks(
        server, keys, reconcile, {"cpuMillis": 2000, "memoryMiB": 2048, "llmSlots": 2}, {}, {})
    http, api = await api_of(server, keys)
    async with http:
        leases = (await api.call("GET", "/v1/runtimes/rt-1/leases", "runtime_1"))["items"]
        (lease,) = [lease for lease in leases if lease["taskId"] == done]
        await api.call("POST", f"/v1/leases/{lease['id']}/complete", "runtime_1",
                       {"outcome": "succeeded", "epoch": lease["epoch"]})

    previews: list[str] = []
    page.on("request", lambda r: previews.append(r.url) if "/placements/preview" in r.url else None)
    await sign_in(page, server, keys.raw["tenant_a"], "tenant")

    # A running task's page previews every pool now, and again at each refresh.
    await page.goto(f"{server}/console/#/tasks/{running}")
    await expect(page.get_by_role("heading", name="Every candidate now")).to_be_visible()
    async with page.expect_request(lambda r: "/placements/preview" in r.url, timeout=WAIT_MS):
        pass
    assert len(previews) >= 2

    # A finished one: its decision, lease history and events, and no preview between one
    # refresh and the next (a preview, were there one, follows its refresh's read at once).
    await page.goto(f"{server}/console/#/tasks/{done}")
    await expect(page.locator("#view h1")).to_contain_text("SUCCEEDED")
    await _next_refresh_of(page, done)
    before = len(previews)
    await _next_refresh_of(page, done)
    await expect(page.get_by_role("heading", name="Decision")).to_be_visible()
    await expect(page.locator(".timeline")).to_contain_text("lease_succeeded")
    await expect(page.get_by_role("heading", name="Every candidate now")).to_have_count(0)
    assert len(previews) == before


async def _next_refresh_of(page: Page, task_id: str) -> None:
    """Wait for the page's next read of the task (its periodic refresh) and its rendering."""
    def reads_task(request: Request) -> bool:
        return request.method == "GET" and request.url.endswith(f"/v1/tasks/{task_id}")

    async with page.expect_response(lambda r: reads_task(r.request), timeout=WAIT_MS):
        pass
    await expect(page.locator("#updated")).to_contain_text("Updated")


async def test_capacity_reads_in_cores_and_gib_with_the_unit_explained(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    (task,) = await pool_and_tasks(
        server, keys, reconcile, {"cpuMillis": 1_500_000, "memoryMiB": 65536, "llmSlots": 1200},
        {"requests": {"cpuMillis": 500, "memoryMiB": 1536, "llmSlots": 1}})

    await sign_in(page, server, keys.raw["admin"], "admin")
    await page.locator("#nav").get_by_role("link", name="Pools").click()
    card = page.locator('article[data-pool="pool-x"]')
    await expect(card.locator('[data-util="cpuMillis"]')).to_have_text("0.5 cores / 1,500 cores")
    await expect(card.locator('[data-util="memoryMiB"]')).to_have_text("1.5 GiB / 64 GiB")
    await expect(card.locator('[data-util="llmSlots"]')).to_have_text("1 / 1,200")
    units = page.locator("[data-units]")
    await expect(units).to_contain_text("1 core = 1,000 millicores")
    await expect(units).to_contain_text("1 GiB = 1,024 MiB")
    await page.get_by_role("button", name="Sign out").click()

    await sign_in(page, server, keys.raw["tenant_a"], "tenant")
    await page.goto(f"{server}/console/#/tasks/{task}")
    requests = page.locator("dd[title]").filter(has_text="CPU")
    await expect(requests).to_have_text("CPU 0.5 cores · Memory 1.5 GiB · LLM slots 1")
    await expect(requests).to_have_attribute("title", "CPU in cores (1 core = 1,000 millicores, "
                                             "the API's cpuMillis) and memory in GiB (1 GiB = "
                                             "1,024 MiB, the API's memoryMiB).")


async def test_the_queue_fits_a_390_px_screen(
    server: str, keys: Keys, browser: Any, reconcile: Any
) -> None:
    _, waiting = await pool_and_tasks(server, keys, reconcile, ONE_TASK, {}, {})
    context = await browser.new_context(viewport={"width": 390, "height": 844},
                                        device_scale_factor=2, is_mobile=True, has_touch=True)
    try:
        page = await context.new_page()
        await sign_in(page, server, keys.raw["tenant_a"], "tenant")
        row = page.locator(f'tr[data-task="{waiting}"]')
        await expect(row).to_be_visible()
        # Every cell of the queue's tables is on the screen, each under its column's name:
        # nothing hides in a sideways scroll, and the page itself never scrolls sideways.
        overflow = await page.evaluate("""() => [...document.querySelectorAll(".stack td")]
            .filter((td) => td.getBoundingClientRect().right > window.innerWidth + 1
                            || td.closest(".table-wrap").scrollWidth
                               > td.closest(".table-wrap").clientWidth + 1)
            .map((td) => td.dataset.label)""")
        assert overflow == []
        assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        for label in ("Closest miss", "Why", "Position", "Estimated start"):
            cell = row.locator(f'td[data-label="{label}"]')
            await expect(cell).to_be_visible()
            box = await cell.bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 391, (label, box)
        await expect(row.locator('td[data-label="Position"]')).to_contain_text("of")
        await page.screenshot(path=screenshot_path("phone"), full_page=False)
    finally:
        await context.close()
