"""`nxctl serve`: options, clear errors, and a real process that drains on SIGTERM and exits 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from engine.settings import EngineSettings
from nxctl.commands import serve as serve_cmd
from nxctl.server.dlq import DeadLetterStore
from nxctl.server.uvicorn_seat import free_socket

runner = CliRunner()
SERVE = "import typer; from nxctl.commands.serve import serve; typer.run(serve)"


def make_app() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command("serve")(serve_cmd.serve)

    @app.callback()
    def _root() -> None:
        """nxctl (test harness)."""

    return app


def test_defaults_are_smollm2_on_loopback_11434() -> None:
    s = serve_cmd.build_settings()
    assert (s.models, s.host, s.port, s.keep_alive_s, s.drain_timeout_s) == (
        ("smollm2",),
        "127.0.0.1",
        11434,
        300.0,
        30.0,
    )
    with_registry = serve_cmd.build_settings(registry=Path("r.toml"))
    assert with_registry.models == ()  # registry models load on demand
    assert serve_cmd.build_settings(keep_alive="-1").keep_alive_s is None
    assert (
        serve_cmd.is_loopback("127.0.0.1")
        and serve_cmd.is_loopback("::1")
        and not serve_cmd.is_loopback("0.0.0.0")
    )


def test_bad_options_are_one_clear_line() -> None:
    result = runner.invoke(make_app(), ["serve", "--model", "tiny", "--keep-alive", "soon"])
    assert result.exit_code == 2 and "nxctl: error: keep_alive must be a duration" in result.output
    result = runner.invoke(make_app(), ["serve", "--model", "tiny", "--max-queue", "0"])
    assert result.exit_code == 2 and "max_queue" in result.output
    result = runner.invoke(make_app(), ["serve", "--model", "tiny", "--speculative", "medusa"])
    assert result.exit_code == 2 and "nxctl: error: unknown speculative method 'medusa'" in result.output
    result = runner.invoke(make_app(), ["serve", "--model", "tiny", "--speculative", "draft"])
    assert result.exit_code == 2 and "needs a draft model" in result.output
    for kv in (["--kv-cache-dtype", "fp8"], ["--dtype", "bfloat16", "--kv-cache-dtype", "float16"]):
        result = runner.invoke(make_app(), ["serve", "--model", "tiny", *kv])
        assert (
            result.exit_code == 2 and "nxctl: error: " in result.output and "kv_cache_dtype" in result.output
        )


REGISTRY = """
[defaults]
num_kv_blocks = 48

[[model]]
id = 0
name = "own"
source = "tiny"
dtype = "float32"
kv_cache_dtype = "float32"

[[model]]
id = 1
name = "bare"
source = "tiny"
"""


def test_engine_flags_fill_what_a_registry_leaves_unset(tmp_path: Path, monkeypatch) -> None:
    """serve --registry with engine flags: each entry's own settings win, then the file's [defaults],
    then the flags (no longer silently dropped), then the built-in defaults."""
    from nxctl.server.models import seat_registry

    path = tmp_path / "r.toml"
    path.write_text(REGISTRY)
    seen = []
    monkeypatch.setattr(serve_cmd, "run_seat", lambda settings, threads: seen.append(settings))
    args = [
        "serve",
        "--registry",
        str(path),
        "--dtype",
        "bfloat16",
        "--num-kv-blocks",
        "8",
        "--block-size",
        "32",
    ]
    result = runner.invoke(make_app(), args)
    assert result.exit_code == 0, result.output
    registry = seat_registry(seen[0].models, seen[0].registry, seen[0].engine)
    own, bare = (registry.resolve(name).engine for name in ("own", "bare"))
    assert (own.dtype, own.kv_cache_dtype, own.num_kv_blocks, own.block_size) == (
        "float32",
        "float32",
        48,
        32,
    )
    assert (bare.dtype, bare.kv_cache_dtype, bare.num_kv_blocks, bare.block_size) == (
        "bfloat16",
        "auto",
        48,
        32,
    )
    assert seat_registry((), path).resolve("bare").engine == EngineSettings(num_kv_blocks=48)


def test_a_flag_that_cannot_pair_with_an_entry_is_one_line(tmp_path: Path) -> None:
    """--kv-cache-dtype float16 under an entry that sets dtype bfloat16: the registry's error names it."""
    from nxctl.server.models import seat_registry

    path = tmp_path / "r.toml"
    path.write_text(REGISTRY.replace('dtype = "float32"\nkv_cache_dtype = "float32"', 'dtype = "bfloat16"'))
    with pytest.raises(Exception, match="model 'own'.*kv_cache_dtype float16"):
        seat_registry((), path, EngineSettings(kv_cache_dtype="float16"))


def test_a_busy_port_is_a_clear_error() -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        with pytest.raises(Exception, match="cannot listen on 127.0.0.1"):
            serve_cmd.listen("127.0.0.1", busy.getsockname()[1])
    finally:
        busy.close()


def test_sigterm_drains_in_flight_requests_aborts_the_rest_and_exits_0(tmp_path: Path) -> None:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    args = [
        "--model",
        "tiny",
        "--port",
        str(port),
        "--dlq",
        str(tmp_path / "dlq.sqlite"),
        "--drain-timeout",
        "0.5",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, *args, "--num-kv-blocks", "128", "--keep-alive", "-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = [proc.stdout.readline() for _ in range(3)]
        assert f"ready at http://127.0.0.1:{port}" in "".join(ready) and "serving tiny" in "".join(ready)
        url = f"http://127.0.0.1:{port}"
        results: dict[str, object] = {}
        started = threading.Event()

        def long_stream() -> None:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "go"}], "stream": True}
            body |= {"max_tokens": 980, "ignore_eos": True}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
                lines = []
                for line in r.iter_lines():
                    lines.append(line)
                    if len(lines) == 4:
                        started.set()
            results["long"] = [ln for ln in lines if ln]

        short_started = threading.Event()

        def short() -> None:
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "options": {"num_predict": 12},
            }
            with httpx.stream("POST", url + "/api/chat", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    short_started.set()
                    results["short"] = json.loads(line)

        t_long = threading.Thread(target=long_stream)
        t_long.start()
        assert started.wait(30)
        t_short = threading.Thread(target=short)
        t_short.start()
        assert short_started.wait(30)  # both in flight
        proc.send_signal(signal.SIGTERM)
        t_short.join(60)
        t_long.join(60)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopped" in out
    assert results["short"]["done"] is True  # finished within the drain timeout
    long_lines = results["long"]
    assert long_lines[-1] == "data: [DONE]"
    assert "shutting down" in json.loads(long_lines[-2][len("data: ") :])["error"]["message"]
    assert "POST /v1/chat/completions model=tiny status=200" in err  # one log line per request
    (letter,) = DeadLetterStore(tmp_path / "dlq.sqlite").list()
    assert letter.model == "tiny" and "shutting down" in letter.reason
