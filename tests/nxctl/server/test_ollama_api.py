"""The Ollama API through the official `ollama` client, on `tiny`."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import ollama
import pytest

from engine.loader import load_tokenizer
from nxctl.server.app import create_app
from nxctl.server.uvicorn_seat import BackgroundSeat
from tests.bos_folders import tiny_with_bos

MESSAGES = [{"role": "user", "content": "Say something."}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture()
def client(seat) -> ollama.Client:
    return ollama.Client(host=seat.url)


def test_chat_streaming_equals_non_streaming(client: ollama.Client) -> None:
    whole = client.chat(model="tiny", messages=MESSAGES, options=GREEDY, stream=False)
    parts = list(client.chat(model="tiny", messages=MESSAGES, options=GREEDY, stream=True))
    assert whole.message.role == "assistant" and whole.done and whole.done_reason in ("stop", "length")
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.eval_count == whole.eval_count <= 8 and last.prompt_eval_count == whole.prompt_eval_count
    for field in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(getattr(last, field), int) and getattr(last, field) >= 0


def test_generate_streaming_and_not_with_context(client: ollama.Client) -> None:
    whole = client.generate(model="tiny", prompt="Once upon a time", options=GREEDY)
    parts = list(client.generate(model="tiny", prompt="Once upon a time", options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == whole.response
    assert whole.context and parts[-1].context == whole.context
    raw = client.generate(model="tiny", prompt="Once upon a time", options=GREEDY, raw=True)
    assert raw.prompt_eval_count < whole.prompt_eval_count  # no chat template around it


def test_seeded_sampling_with_ollama_defaults_is_reproducible(client: ollama.Client) -> None:
    opts = {"seed": 42, "num_predict": 10}
    a = client.chat(model="tiny", messages=MESSAGES, options=opts)
    b = client.chat(model="tiny", messages=MESSAGES, options=opts)
    assert a.message.content == b.message.content


def test_stop_option(client: ollama.Client) -> None:
    free = client.generate(model="tiny", prompt="abc", options={"temperature": 0, "num_predict": 16}).response
    stop = free[4:6]
    cut = client.generate(
        model="tiny", prompt="abc", options={"temperature": 0, "num_predict": 16, "stop": [stop]}
    )
    assert cut.response == free[: free.find(stop)] and cut.done_reason == "stop"


def test_embed_show_tags_ps_version(client: ollama.Client) -> None:
    emb = client.embed(model="tiny", input=["hello", "world"])
    assert len(emb.embeddings) == 2 and len(emb.embeddings[0]) == 64
    show = client.show("tiny")
    assert "<|im_start|>" in show.template and show.modelinfo["general.architecture"] == "llama"
    assert [m.model for m in client.list().models] == ["tiny:latest"]
    ps = client.ps().models
    assert [m.model for m in ps] == ["tiny:latest"] and ps[0].size > 0 and ps[0].context_length == 1024
    assert isinstance(client._client.get("/api/version").json()["version"], str)


def test_what_ollamas_clients_probe_and_send_beside_the_core_api(client: ollama.Client, seat) -> None:
    """The liveness answer at / (GET and HEAD, as the ollama CLI probes it), HEAD on the listing
    routes, the older /api/embeddings (the client's embeddings()), an empty embed input as a load,
    capabilities from the template, and message and option forms Ollama reads loosely."""
    root = httpx.get(seat.url + "/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    for path in ("/", "/api/version", "/api/tags"):
        assert httpx.head(seat.url + path).status_code == 200
    one = client.embeddings(model="tiny", prompt="hello").embedding
    assert one == pytest.approx(client.embed(model="tiny", input="hello").embeddings[0], abs=1e-6)
    assert client.embeddings(model="tiny", prompt="").embedding == []
    assert client.embed(model="tiny", input=[]).embeddings == []
    assert client.show("tiny").capabilities[0] == "completion"
    loose = {
        "model": "tiny",
        "stream": False,
        "messages": [
            {"role": "User", "content": "Say something."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
            },
            {"role": "tool", "content": "done", "tool_call_id": "call_0", "tool_name": "f"},
        ],
        "options": {**GREEDY, "mirostat_eta": None},
        "think": "high",
    }
    r = httpx.post(seat.url + "/api/chat", json=loose, timeout=60)
    assert r.status_code == 200, r.text
    raw = {"model": "tiny", "prompt": "x", "raw": True, "system": "s", "stream": False}
    bad = httpx.post(seat.url + "/api/generate", json=raw, timeout=60)
    assert bad.status_code == 400 and "raw mode" in bad.json()["error"]


def test_a_raw_prompt_begins_with_bos_once_never_after_a_context(tmp_path: Path, tiny_settings) -> None:
    """A model whose tokenizer adds BOS, with no chat template: /api/generate's prompt begins with BOS;
    the next turn's prompt, after the context it sends back, gets none (one BOS a sequence)."""
    folder, _ = tiny_with_bos(tmp_path, chat_template=False)
    with BackgroundSeat(create_app(tiny_settings(tmp_path, models=(str(folder),)))) as url:
        client = ollama.Client(host=url)
        first = client.generate(model=folder.name, prompt="Once upon a time", options=GREEDY)
        plain = len(load_tokenizer(folder)[1].encode("Once upon a time"))
        assert first.prompt_eval_count == plain + 1
        second = client.generate(
            model=folder.name, prompt="Once upon a time", context=first.context, options=GREEDY
        )
        assert second.prompt_eval_count == len(first.context) + plain


def test_long_chat_is_truncated_oldest_turns_first_system_kept(client: ollama.Client) -> None:
    system = {"role": "system", "content": "You are terse."}
    old = [{"role": "user", "content": "word " * 300}, {"role": "assistant", "content": "ok " * 300}]
    last = {"role": "user", "content": "And now?"}
    options = {"temperature": 0, "num_predict": 4, "num_ctx": 256}
    short = client.chat(model="tiny", messages=[system, last], options=options)
    long = client.chat(model="tiny", messages=[system, *old, last], options=options)
    assert long.prompt_eval_count == short.prompt_eval_count  # the old turns went; system + last stayed
    assert long.message.content == short.message.content
    prompt = client.generate(model="tiny", prompt="x " * 3000, options={"num_predict": 4, "num_ctx": 512})
    assert prompt.prompt_eval_count <= 512 - 4


def test_keep_alive_zero_unloads_and_an_empty_request_loads(tmp_path: Path, tiny_settings) -> None:
    app = create_app(tiny_settings(tmp_path, keep_alive_s=300))
    with BackgroundSeat(app) as url:
        client = ollama.Client(host=url)
        client.chat(model="tiny", messages=MESSAGES, options=GREEDY, keep_alive=0)
        assert _wait_for(lambda: client.ps().models == [])
        loaded = client.generate(model="tiny", prompt="")
        assert loaded.done_reason == "load" and [m.model for m in client.ps().models] == ["tiny:latest"]
        unloaded = httpx.post(
            url + "/api/chat", json={"model": "tiny", "messages": [], "keep_alive": 0}
        ).json()
        assert unloaded["done_reason"] == "unload" and client.ps().models == []
        client.chat(model="tiny", messages=MESSAGES, options=GREEDY, keep_alive="1s")
        assert client.ps().models[0].expires_at is not None
        assert _wait_for(lambda: client.ps().models == [], timeout=10)  # the reaper unloads it


def _wait_for(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
