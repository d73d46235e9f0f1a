"""The server's continuous batch (xattn/serve/engine.py): greedy requests join and leave between decoder
steps, get what translate gives each alone, never wait for a longer request, and leave when their client does."""
import asyncio
import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import xattn  # noqa: E402
from xattn.serve.app import create_app  # noqa: E402
from xattn.serve.batcher import Batcher  # noqa: E402
from xattn.serve.limits import Limits  # noqa: E402
from tests.test_serve_turns import until  # noqa: E402


def ready(c: TestClient) -> TestClient:
    while c.get("/health").status_code != 200:
        time.sleep(0.02)
    return c


def test_greedy_requests_share_a_continuous_batch_and_get_what_translate_gives_each(numbers_model):
    texts = ["eins", "zwei", "drei hundert", "vier", "fünf tausend", "sechs", "sieben", "acht neun", "neun", "zehn"]
    with TestClient(create_app(str(numbers_model), dataclasses.replace(Limits(), batch_wait_ms=0))) as c:
        ready(c)
        with ThreadPoolExecutor(len(texts)) as pool:
            replies = list(pool.map(lambda t: c.post("/translate", json={"q": [t, t + " eins"], "beam_size": 1}), texts))
        calls = c.app.state.xattn.served[0].model.batcher.calls
    translator = xattn.load(numbers_model)
    cfg = dataclasses.replace(translator.decode_config, beam_size=1)
    for text, reply in zip(texts, replies):
        assert reply.status_code == 200, reply.text
        for got, source in zip(reply.json()["translatedText"], [text, text + " eins"]):
            assert got == translator.translate([source], cfg)[0].text
    assert calls == 0  # streamed, not batched into translate calls


def test_a_short_request_is_answered_while_a_long_one_runs(numbers_model):
    limits = dataclasses.replace(Limits(), batch_wait_ms=0, max_output_tokens=4000, max_work=10 ** 8)
    long = {"q": ["drei hundert vier und zwanzig"] * 32, "beam_size": 1, "max_len_a": 0, "max_len_b": 3000, "min_len": 0}
    with TestClient(create_app(str(numbers_model), limits)) as c:
        ready(c)
        finished = {}

        def post(name, body):
            c.post("/translate", json=body)
            finished[name] = time.perf_counter()
        worker = threading.Thread(target=post, args=("long", long))
        worker.start()
        engine = c.app.state.xattn.served[0].model.batcher.engine
        for _ in range(1000):  # until the long one is being decoded, however slowly a loaded machine got there
            if engine.rows:
                break
            time.sleep(0.01)
        post("short", {"q": "drei", "beam_size": 1})
        worker.join()
    assert finished["short"] < finished["long"]


@pytest.mark.parametrize("ended_by", ["client", "deadline"])
def test_a_request_whose_client_gave_up_or_whose_time_is_up_leaves_the_batch(ended_by):
    class Streams:
        def __init__(self):
            self.cancelled, self.added = [], []

        def streamable(self, settings):
            return True

        def open_stream(self, settings):
            return self

        def add(self, texts, tags):
            self.added += tags

        def __len__(self):
            return len(self.added) - len(self.cancelled)

        def step(self):  # nothing ever ends
            time.sleep(0.001)
            return []

        def cancel(self, tag):
            self.cancelled.append(tag)
            return True

    streams = Streams()

    async def main():
        batcher = Batcher(lambda texts, settings: texts, streams=streams)
        batcher.start()
        with pytest.raises(asyncio.TimeoutError) as ended:
            if ended_by == "client":  # gives up while the request's own deadline is still ahead
                await asyncio.wait_for(batcher.submit(["a", "b"], "greedy", timeout=5), 0.1)
            else:  # the request's own deadline (the server's timeout); the client would wait 5 s
                await asyncio.wait_for(batcher.submit(["a", "b"], "greedy", timeout=0.1), 5)
        # wait_for's TimeoutError comes from cancelling the wait; the deadline's does not
        assert isinstance(ended.value.__context__, asyncio.CancelledError) == (ended_by == "client")
        for _ in range(100):
            if len(streams.cancelled) == 2:
                break
            await asyncio.sleep(0.01)
        await batcher.stop()
        return batcher.metrics.stopped

    assert asyncio.run(main()) == 1  # one request stopped (xattn_stopped_total), of two sentences
    assert sorted(streams.cancelled) == sorted(streams.added) and len(streams.added) == 2



def test_requests_waiting_for_a_step_join_in_one_encoder_pass_and_a_failing_one_fails_alone():
    class Streams:
        """Steps wait for `go`; a text "bad" makes add fail; every sentence ends at its first step."""

        def __init__(self):
            self.go, self.adds, self.rows = threading.Event(), [], []

        def streamable(self, settings):
            return True

        def open_stream(self, settings):
            return self

        def add(self, texts, tags):
            if "bad" in texts:
                raise ValueError("bad text")
            self.adds.append(list(texts))
            self.rows += zip(tags, texts)

        def __len__(self):
            return len(self.rows)

        def step(self):
            self.go.wait()
            ended, self.rows = [(tag, text.upper()) for tag, text in self.rows], []
            return ended

        def cancel(self, tag):
            return False

    streams = Streams()

    async def while_a_step_runs(batcher: Batcher, first: list[str], *later: list[str]) -> list:
        """Submit `first`, and `later` while its step waits; then let the steps go."""
        streams.go.clear()
        running = asyncio.ensure_future(batcher.submit(first, "greedy"))
        await until(lambda: streams.rows)
        waiting = [asyncio.ensure_future(batcher.submit(q, "greedy")) for q in later]
        await until(lambda: batcher.engine.waiting == len(later))
        streams.go.set()
        return await asyncio.gather(running, *waiting, return_exceptions=True)

    async def main():
        batcher = Batcher(lambda texts, settings: texts, streams=streams)
        batcher.start()
        try:
            together = await while_a_step_runs(batcher, ["a"], ["b", "c"], ["d"])
            apart = await while_a_step_runs(batcher, ["e"], ["bad"], ["f"])
        finally:
            await batcher.stop()
        return together, apart

    together, apart = asyncio.run(main())
    assert together == [["A"], ["B", "C"], ["D"]]
    assert apart[0] == ["E"] and isinstance(apart[1], ValueError) and apart[2] == ["F"]
    assert streams.adds == [["a"], ["b", "c", "d"], ["e"], ["f"]]  # b, c, d in one pass; bad's failure alone


def test_a_request_that_fits_passes_one_waiting_for_room_until_as_many_sentences_as_it_holds_have():
    """In strict order, a request of a full batch's sentences waited for the batches to empty, and every request
    behind it, one sentence included, waited with it. Those that fit now pass it, until as many sentences as it holds
    have: then the batches drain for it, and it runs."""
    from collections import deque

    from xattn.serve.engine import Engine, Job
    from xattn.serve.metrics import BatchMetrics

    class Stream:
        def __init__(self):
            self.added = []

        def add(self, texts, tags):
            self.added += texts

        def __len__(self):
            return len(self.added)

    class Streams:
        def open_stream(self, settings):
            return Stream()

    loop = asyncio.new_event_loop()
    try:
        engine, open_ = Engine(Streams(), 4, BatchMetrics()), {}
        jobs = {name: Job([f"{name}{i}" for i in range(size)], "greedy", True, loop.create_future())
                for name, size in (("a", 3), ("b", 3), ("c", 1), ("d", 1), ("e", 1), ("f", 1))}
        held = deque(jobs.values())
        engine.waiting = len(held)

        def admitted() -> list[str]:
            return [text[0] for text in open_["greedy"].stream.added] if open_ else []

        def ends(name: str) -> None:  # its sentences leave the batch
            rows = open_["greedy"].rows
            for tag in [tag for tag, (job, _) in rows.items() if job is jobs[name]]:
                del rows[tag]

        engine._admit(held, open_)
        assert admitted() == ["a"] * 3 + ["c"] and [job.texts[0][0] for job in held] == ["b", "d", "e", "f"]
        for name, joins in (("c", "d"), ("d", "e")):
            ends(name)
            engine._admit(held, open_)
            assert admitted()[-1] == joins
        ends("e")  # 3 sentences have passed b: f waits behind it now
        engine._admit(held, open_)
        assert admitted()[-1] == "e" and [job.texts[0][0] for job in held] == ["b", "f"]
        ends("a")
        engine._admit(held, open_)
        assert admitted()[-4:] == ["b"] * 3 + ["f"] and not held and engine.waiting == 0
    finally:
        loop.close()
