"""`nxctl model list|info` and `nxctl run` on models from Ollama's store and the Hugging Face cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nxctl.cli import app
from nxctl.server.uvicorn_seat import free_socket
from tests.store_layout import cache_hf, pull_ollama

runner = CliRunner()
SERVE = "import typer; from nxctl.commands.serve import serve; typer.run(serve)"
TINY = Path(__file__).resolve().parents[2] / "fixtures" / "tiny"


@pytest.fixture()
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_gguf: Path) -> None:
    """An Ollama store with fixture:q (a manifest asking for greedy decoding) and a hub cache with nxctl/tiny."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    pull_ollama(tmp_path / "ollama", "fixture:q", small_gguf, {"temperature": 0, "num_predict": 5})
    cache_hf(tmp_path / "hub", "nxctl/tiny", sorted(p for p in TINY.iterdir() if p.is_file()))


def test_model_list_shows_store_and_cache_models_with_their_sizes(stores, small_gguf: Path):
    result = runner.invoke(app, ["model", "list"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if line.count("│") >= 5}
    assert "ollama" in lines["fixture:q"] and "hf-cache" in lines["nxctl/tiny"]
    size = f"{small_gguf.stat().st_size / 2**20:,.1f} MiB"
    assert size in lines["fixture:q"]  # an F32 file: held as it is stored
    assert lines["fixture:q"].count(size) == 2


def test_model_info_of_a_store_model(stores):
    result = runner.invoke(app, ["model", "info", "fixture:q"])
    assert result.exit_code == 0, result.output
    assert "ollama" in result.stdout and "256" in result.stdout


def test_run_answers_from_both_stores(stores):
    pulled = runner.invoke(app, ["run", "fixture:q", "Hello", "--raw"])
    assert pulled.exit_code == 0, pulled.output
    again = runner.invoke(app, ["run", "fixture:q", "Hello", "--raw"])
    assert pulled.stdout == again.stdout  # the manifest's temperature 0: greedy
    longer = runner.invoke(app, ["run", "fixture:q", "Hello", "--raw", "-n", "12"])
    assert len(longer.stdout) > len(pulled.stdout)  # the manifest's num_predict 5, overridden
    cached = runner.invoke(app, ["run", "nxctl/tiny", "Hello", "-n", "4"])
    assert cached.exit_code == 0 and cached.stdout.strip(), cached.output


@pytest.mark.parametrize("name", ["../../etc/passwd-model", "%2e%2e/fixture:q", "fixture:../../q"])
def test_a_name_outside_the_stores_is_one_clear_line(stores, name: str):
    result = runner.invoke(app, ["run", name, "hi"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown model" in lines[0]


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3"])
def test_run_answers_on_a_family_from_either_store(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A non-Llama family through both store layouts: the GGUF llama.cpp converted (its SentencePiece
    vocabulary rebuilt, for Gemma 3 and Phi-3), and the folder."""
    families = TINY.parent / "families"
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    pulled_name = f"{family}-fixture:tiny"
    pull_ollama(tmp_path / "ollama", pulled_name, families / f"{family}.gguf", {"temperature": 0})
    cache_hf(
        tmp_path / "hub", f"nxctl/{family}", sorted(p for p in (families / family).iterdir() if p.is_file())
    )
    pulled = runner.invoke(app, ["run", pulled_name, "Hello", "-n", "6"])
    cached = runner.invoke(app, ["run", f"nxctl/{family}", "Hello", "-n", "6", "--temperature", "0"])
    assert pulled.exit_code == 0 and cached.exit_code == 0, pulled.output + cached.output
    assert pulled.stdout.strip() and cached.stdout.strip()
    info = runner.invoke(app, ["model", "info", pulled_name])
    assert family in info.stdout and "ollama" in info.stdout


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_serve_answers_on_a_family_from_either_store(family: str, tmp_path: Path):
    """A real seat on a model pulled into Ollama's store and one in the hub cache, asked by the official
    ollama and openai clients under the names those stores give them."""
    ollama_client = pytest.importorskip("ollama")
    openai = pytest.importorskip("openai")
    families = TINY.parent / "families"
    pulled_name = f"{family}-fixture:tiny"
    pull_ollama(tmp_path / "ollama", pulled_name, families / f"{family}.gguf", {"temperature": 0})
    cache_hf(
        tmp_path / "hub", f"nxctl/{family}", sorted(p for p in (families / family).iterdir() if p.is_file())
    )
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "OLLAMA_MODELS": str(tmp_path / "ollama"), "HF_HUB_CACHE": str(tmp_path / "hub")}
    args = ["--model", pulled_name, "--model", f"nxctl/{family}", "--port", str(port)]
    args += ["--dlq", str(tmp_path / "dlq.sqlite"), "--num-kv-blocks", "64"]
    proc = subprocess.Popen([sys.executable, "-c", SERVE, *args], stdout=subprocess.PIPE, text=True, env=env)
    try:
        ready = "".join(proc.stdout.readline() for _ in range(3))
        assert f"ready at http://127.0.0.1:{port}" in ready, ready
        url = f"http://127.0.0.1:{port}"
        chat = ollama_client.Client(host=url).chat(
            model=pulled_name,
            messages=[{"role": "user", "content": "Hello"}],
            options={"num_predict": 5},
        )
        assert chat.message.content and chat.done
        completion = openai.OpenAI(base_url=url + "/v1", api_key="none").chat.completions.create(
            model=f"nxctl/{family}",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=5,
            temperature=0,  # greedy: a sampled reply of the tiny model can be an end token alone
        )
        assert completion.choices[0].message.content and completion.usage.completion_tokens <= 5
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
