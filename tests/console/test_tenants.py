"""The console's Tenants page: a clear "no quotas configured" state, and, with quotas, each
tenant's nominal, used and borrowed capacity per runtime class — a tenant sees only its own."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Page, expect

from tests.api.conftest import Keys
from tests.console.conftest import screenshot_path
from tests.console.test_console import ONE_TASK, api_of, sign_in

FOUR_TASKS = {"cpuMillis": 4000, "memoryMiB": 4096, "llmSlots": 4}


async def test_without_quotas_the_page_says_so(server: str, keys: Keys, page: Page) -> None:
    await sign_in(page, server, keys.raw["operator_x"], "operator")
    await expect(page.get_by_role("link", name="Tenants")).to_be_hidden()
    await page.get_by_role("button", name="Sign out").click()

    await sign_in(page, server, keys.raw["admin"], "admin")
    await page.get_by_role("link", name="Tenants").click()

    await expect(page.locator('[data-empty="quotas"]')).to_contain_text("No quotas configured")
    await expect(page.locator("#problem")).to_be_hidden()
    await page.screenshot(path=screenshot_path("tenants"), full_page=True)


async def test_quotas_show_nominal_used_and_borrowed_per_tenant(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    http, api = await api_of(server, keys)
    async with http:
        probe = await http.get("/v1/tenants", headers=keys.admin)
        if probe.status_code == 404:
            pytest.skip("this build has no quotas API (GET /v1/tenants answers 404)")
        await api.call("PUT", "/v1/tenants/tenant-a", "admin", {"quotas": {"gpu-small": {
            "cpuMillis": {"nominal": 1000}, "llmSlots": {"nominal": 4}}}})
        await api.call("PUT", "/v1/tenants/tenant-b", "admin", {"quotas": {"gpu-small": {
            "cpuMillis": {"nominal": 2000, "lendingLimit": 2000}}}})
        await api.pool("pool-x", FOUR_TASKS, tenantIds=["tenant-a", "tenant-b"])
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        # Two tasks of 1 core: one within tenant-a's nominal, one borrowed from tenant-b.
        for _ in range(2):
            await api.submit(requests=ONE_TASK)
        assert (await reconcile()).leased == 2

    await sign_in(page, server, keys.raw["admin"], "admin")
    await page.get_by_role("link", name="Tenants").click()
    cpu = page.locator('tr[data-quota="tenant-a/gpu-small/cpuMillis"]')
    await expect(cpu.locator("td").nth(1)).to_have_text("1 core")
    await expect(cpu.locator("td").nth(2)).to_have_text("2 cores")
    await expect(cpu.locator("td").nth(3)).to_have_text("1 core")
    await expect(page.locator('article[data-tenant="tenant-b"]')).to_be_visible()
    await expect(page.locator('[data-empty="quotas"]')).to_have_count(0)
    await page.screenshot(path=screenshot_path("tenants"), full_page=True)
    await page.get_by_role("button", name="Sign out").click()

    # A tenant key sees its own tenant only.
    await sign_in(page, server, keys.raw["tenant_b"], "tenant")
    await page.get_by_role("link", name="Tenants").click()
    await expect(page.locator('article[data-tenant="tenant-b"]')).to_be_visible()
    await expect(page.locator('article[data-tenant="tenant-a"]')).to_have_count(0)
    assert "tenant-a" not in await page.locator("main").inner_text()



async def test_the_cohort_tree_is_drawn_with_bars(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    http, api = await api_of(server, keys)
    async with http:
        for cohort, parent in (("org", None), ("team1", "org"), ("team2", "org")):
            await api.call("PUT", f"/v1/cohorts/{cohort}", "admin", {"parent": parent})
        await api.call("PUT", "/v1/tenants/tenant-a", "admin", {"cohort": "team1", "quotas": {
            "gpu-small": {"cpuMillis": {"nominal": 1000}}}})
        await api.call("PUT", "/v1/tenants/tenant-b", "admin", {"cohort": "team2", "quotas": {
            "gpu-small": {"cpuMillis": {"nominal": 2000}}}})
        await api.pool("pool-x", FOUR_TASKS, tenantIds=["tenant-a", "tenant-b"])
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        # Two tasks of 1 core for tenant-a: one its own, one borrowed through org.
        for _ in range(2):
            await api.submit(requests=ONE_TASK)
        assert (await reconcile()).leased == 2

    await sign_in(page, server, keys.raw["admin"], "admin")
    await page.get_by_role("link", name="Tenants").click()
    team1 = page.locator('li[data-cohort="org"] li[data-cohort="team1"]')
    await expect(team1).to_be_visible()
    await expect(team1.locator('li[data-member="tenant-a"]')).to_be_visible()
    await expect(team1.locator('[data-level="team1/gpu-small/cpuMillis"] .bar')).to_have_attribute(
        "aria-label", "2 cores used of 1 core cap, 1 core borrowed")
    await expect(page.locator('[data-level="org/gpu-small/cpuMillis"] .bar')).to_have_attribute(
        "aria-label", "2 cores used of 3 cores cap, 0 cores borrowed")
    await page.screenshot(path=screenshot_path("tenants-tree"), full_page=True)
    await page.get_by_role("button", name="Sign out").click()

    # A tenant key sees the cohorts on its path, not its aunt's numbers.
    await sign_in(page, server, keys.raw["tenant_a"], "tenant")
    await page.get_by_role("link", name="Tenants").click()
    await expect(page.locator('li[data-cohort="team1"]')).to_be_visible()
    await expect(page.locator('li[data-cohort="team2"]')).to_have_count(0)
