"""The Queue page follows the watch feed: a task submitted, then placed, through the API shows
on the open page because the feed announced it, not because a timer reloaded the page."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page, Request, Response, expect

from tests.api.conftest import Keys
from tests.console.test_console import ONE_TASK, api_of, sign_in


class Network:
    """The page's requests to the feed and to the queue, in the order the browser saw them:
    ``("watch", items)`` when a watch answer arrives, ``("queue",)`` when the queue is asked."""

    def __init__(self, page: Page) -> None:
        self.log: list[tuple[Any, ...]] = []
        page.on("request", self._request)
        page.on("response", self._response)

    def _request(self, request: Request) -> None:
        if "/v1/queue" in request.url:
            self.log.append(("queue",))

    async def _response(self, response: Response) -> None:
        if "/v1/watch" in response.url:
            at = len(self.log)  # the answer's place, before its body is awaited
            self.log.append(("watch", 0))
            if response.status != 200:
                self.log[at] = ("watch", 0, response.status)
            else:
                self.log[at] = ("watch", len((await response.json())["items"]))

    def unannounced_queue_reads(self, since: int) -> list[int]:
        """Return the indexes (from ``since``) of queue reads not made in answer to a watch
        answer that carried events: reads a timer, not the feed, would have made."""
        return [i for i in range(since, len(self.log)) if self.log[i] == ("queue",)
                and not (i > 0 and self.log[i - 1][0] == "watch" and self.log[i - 1][1] > 0)]


async def test_the_queue_page_updates_from_the_feed_without_its_refresh(
    server: str, keys: Keys, page: Page, reconcile: Any
) -> None:
    network = Network(page)
    http, api = await api_of(server, keys)
    async with http:
        await api.pool("pool-x", ONE_TASK)
        await api.call("POST", "/v1/runtimes/rt-1/heartbeat", "runtime_1")
        async with page.expect_request(lambda r: "/v1/watch" in r.url):
            await sign_in(page, server, keys.raw["tenant_a"], "tenant")
        waiting = page.locator(".stats .stat").first
        await expect(waiting).to_contain_text("0waiting")
        start = len(network.log)

        task = await api.submit()
        await expect(waiting).to_contain_text("1waiting")
        await expect(page.locator(f'tr[data-task="{task}"]')).to_be_visible()

        assert (await reconcile()).leased == 1
        await expect(waiting).to_contain_text("0waiting")

    assert network.log[start:].count(("queue",)) >= 2, network.log
    assert network.unannounced_queue_reads(start) == [], network.log
    await expect(page.locator("#updated")).to_contain_text("follows changes as they happen")
