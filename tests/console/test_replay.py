"""The console's Task page links the replay of a placed task's decision; an admin opening
the link sees whether this build decides the same."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, expect

from tests.api.conftest import Keys
from tests.console.test_console import ONE_TASK, api_of, sign_in


async def test_a_placed_task_links_the_replay_an_admin_runs(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    http, api = await api_of(server, keys)
    async with http:
        await api.pool("pool-x", ONE_TASK)
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        placed = await api.submit()
        assert (await reconcile()).leased == 1

    await sign_in(page, server, keys.raw["tenant_a"], "tenant")
    await page.goto(f"{server}/console/#/tasks/{placed}")
    link = page.get_by_role("link", name="Replay this decision")
    await expect(link).to_have_attribute("href", f"#/replay/{placed}")
    await link.click()
    await expect(page.locator("#view")).to_contain_text("Replays are for admins")

    await page.goto(f"{server}/console/")
    await page.evaluate("localStorage.clear(); sessionStorage.clear()")
    await page.context.clear_cookies()
    admin = await page.context.new_page()
    await sign_in(admin, server, keys.raw["admin"], "admin")
    await admin.goto(f"{server}/console/#/replay/{placed}")
    await expect(admin.locator('[data-replay="identical"]')).to_contain_text(
        "identical: 1 of 1 decisions")
