"""LiveFeed: one poller for every listener, a payload only when something but the clock changed, polling
stops when the last listener leaves, a failed read is published and retried."""

from __future__ import annotations

import asyncio
import json

from feiqiu_etl.web.live import LiveFeed


def test_listeners_share_one_poller_and_get_only_changes():
    state = {"beat": 0, "reads": 0}

    def read():
        state["reads"] += 1
        if state["reads"] == 3:
            raise OSError("database went away")
        return {"now": f"t{state['reads']}", "running": [{"run_id": "r", "status": "RUNNING",
                                                          "heartbeat_at": f"b{state['beat']}", "live": {}}],
                "finished": []}

    async def scenario():
        feed = LiveFeed(read, interval=0.02)
        got: dict[str, list] = {"a": [], "b": []}

        async def listen(name: str, n: int):
            async for payload in feed.listen():
                got[name].append(json.loads(payload))
                if len(got[name]) == n:
                    return

        async def beat():
            await asyncio.sleep(0.2)
            state["beat"] = 1

        await asyncio.wait_for(asyncio.gather(listen("a", 4), listen("b", 4), beat()), 5)
        await asyncio.sleep(0.1)
        return feed, got

    feed, got = asyncio.run(scenario())
    assert got["a"] == got["b"]
    first, error, again, beat = got["a"]
    assert first["running"][0]["heartbeat_at"] == "b0" and "error" in error
    assert again["running"][0]["heartbeat_at"] == "b0" and beat["running"][0]["heartbeat_at"] == "b1"
    stats = feed.statistics()
    assert stats.listeners == 0 and not stats.polling and stats.failed_polls == 1 and stats.changes == 4
    assert stats.polls >= 10  # about every 20 ms for 0.2 s, but only 4 payloads were sent
