"""Each client's share of the queue (issue 67, item 6): one client cannot fill every slot and lock the others out.

A client that posts 20 comparisons gets its share queued and the rest refused at once, with HTTP 429 and a message,
while a second client is served; several sessions from one address share the address's bound. Served apps run a
slow model (``slow_app``: 20 ms a forward, no EOS), so that the first client's requests are still waiting.
"""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from hf_speculative.app.queue_share import QueueShare, ShareExceeded, default_per_address
from tests.app.conftest import TINY_PROMPT, compare_args, generation_threads, slow_app, wait_until


@dataclasses.dataclass
class FakeFn:
    api_name: str


@dataclasses.dataclass
class FakeClient:
    host: str


@dataclasses.dataclass
class FakeRequest:
    client: FakeClient


@dataclasses.dataclass
class FakeEvent:
    session_hash: str
    address: str
    api_name: str = "compare"

    @property
    def fn(self) -> FakeFn:
        return FakeFn(self.api_name)

    @property
    def request(self) -> FakeRequest:
        return FakeRequest(FakeClient(self.address))


def test_a_client_within_its_share_is_admitted_and_beyond_it_told_why():
    share = QueueShare(per_session=2, per_address=3)
    events = [FakeEvent("a", "10.0.0.1"), FakeEvent("a", "10.0.0.1"), FakeEvent("b", "10.0.0.2"),
              FakeEvent("x", "10.0.0.1", api_name="other")]  # the page's helpers do not count
    share.check(events, "c", "10.0.0.1")
    share.check(events, "b", "10.0.0.2")
    with pytest.raises(ShareExceeded) as session:
        share.check(events, "a", "10.0.0.9")
    assert str(session.value) == (
        "This session already has 2 comparisons waiting or running, its share of the queue (2): wait for one to "
        "finish, or stop it, before sending another.")
    crowded = events + [FakeEvent("d", "10.0.0.1")]
    with pytest.raises(ShareExceeded, match=r"Your address already has 3 comparisons waiting or running, its share "
                                            r"of the queue \(3\)"):
        share.check(crowded, "e", "10.0.0.1")
    QueueShare(per_session=0, per_address=0).check(crowded * 10, "a", "10.0.0.1")  # 0: no bound


def test_the_defaults_and_bad_shares():
    assert default_per_address(16) == 8 and default_per_address(1) == 2
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"QueueShare\(per_session=.*\): a whole number >= 0"):
            QueueShare(per_session=bad)


def _form(model) -> list:
    return compare_args(TINY_PROMPT, str(model), ["prompt-lookup"], max_new_tokens=400)


def test_a_second_client_is_served_while_the_first_has_20_requests_queued(tiny_chat_dir):
    from gradio_client import Client

    with slow_app(tiny_chat_dir, seconds_per_forward=0.005) as (url, _):
        first = Client(url, verbose=False)
        jobs = [first.submit(*_form(tiny_chat_dir), api_name="/compare") for _ in range(20)]
        assert wait_until(generation_threads, 30), "the first client's first request never started"
        assert wait_until(lambda: sum(job.done() for job in jobs) >= 18, 20)
        refused = [job for job in jobs if job.done()]
        assert len(refused) == 18, "two queued (its share), the others refused at once"
        for job in refused:
            with pytest.raises(httpx.HTTPStatusError, match="429") as caught:
                job.result(timeout=1)
            assert "This session already has 2 comparisons waiting or running" in caught.value.response.text
        # sent while the first client holds its share: queued behind it, not refused; served once the first's end
        second = Client(url, verbose=False).submit(
            *compare_args(TINY_PROMPT, str(tiny_chat_dir), ["prompt-lookup"], max_new_tokens=4),
            api_name="/compare")
        for job in jobs:
            job.cancel()
        assert second.result(timeout=60)[0].startswith("Done: 2/2")
        assert wait_until(lambda: not generation_threads(), 10)


def test_sessions_from_one_address_share_the_address_bound(tiny_chat_dir):
    """A client making up a new session for every request (a new gradio_client.Client each time; raw HTTP's
    /gradio_api/call/compare makes one per call) meets the address's bound, which leaves the rest of the queue to
    others."""
    from gradio_client import Client

    with slow_app(tiny_chat_dir, seconds_per_forward=0.005, max_per_address=3) as (url, _):
        jobs = [Client(url, verbose=False).submit(*_form(tiny_chat_dir), api_name="/compare") for _ in range(5)]
        assert wait_until(lambda: sum(job.done() for job in jobs) >= 2, 20)
        refused = [job for job in jobs if job.done()]
        assert len(refused) == 2, "three sessions queued (the address's share), the others refused"
        for job in refused:
            with pytest.raises(httpx.HTTPStatusError, match="429") as caught:
                job.result(timeout=1)
            assert ("Your address already has 3 comparisons waiting or running, its share of the queue (3)"
                    in caught.value.response.text)
        for job in jobs:
            job.cancel()
        assert wait_until(lambda: not generation_threads(), 10)
