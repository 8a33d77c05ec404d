"""The llama.cpp peer's driver: llama.cpp's own binaries (`make peers` builds them natively) on the GGUF.

A plain script run by the llamacpp peer's own python (standard library only):
``python drive_llamacpp.py JOB.json ANSWER.json``; the JSON is nxctl/bench/peers/protocol.py's. The
binaries' folder comes in ``NXCTL_LLAMACPP_BIN``.

- Requests: ``llama-server`` with ``-np`` = the job's max_num_seqs slots, each of ``max_model_len``
  cells (``-c`` = slots x that, one KV stream per slot), prompt caching off (``--no-cache-prompt``, and
  ``cache_prompt: false`` per request), continuous batching (its default). Each request is sent at its
  arrival time from a thread of its own to ``/completion`` with the prompt as token ids, greedy
  (``samplers: ["top_k"]``, ``top_k: 1``), ``ignore_eos`` and ``n_predict`` = max_tokens, streamed with
  ``return_tokens``, so each token's arrival is timed as a client sees it (a chunk's ``tokens_predicted``
  counts the tokens so far: the stream leaves out the id of a token whose text ends inside a UTF-8
  character, and the answer's ``output_tokens`` counts it). ``forwards`` is the server's
  ``llamacpp:n_decode_total`` over the repeat (its llama_decode calls).
- One request's decode and a prompt's prefill as llama.cpp reports them: ``llama-bench -p 512 -n 128``
  (``-r 3``), in ``info.llama_bench`` (tok/s of each test), the figures llama.cpp's own users quote; with
  the job's ``long_prompts`` also ``llama-bench -p 4096,16000 -n 0 -r 1``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH_PROMPT, BENCH_GEN, BENCH_REPEATS = 512, 128, 3


def binaries() -> Path:
    folder = Path(os.environ.get("NXCTL_LLAMACPP_BIN", ""))
    if not (folder / "llama-server").is_file():
        raise RuntimeError(f"no llama-server in {folder} (NXCTL_LLAMACPP_BIN): run `make peers`")
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A llama-server process for the job, on a free port of 127.0.0.1; ``load_s`` until it answered."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.port = free_port()
        seqs, per_seq = job["max_num_seqs"], 256 * -(-job["max_model_len"] // 256)
        threads = str(job["threads"])
        cmd = [
            str(binaries() / "llama-server"), "-m", job["model"], "--host", "127.0.0.1", "--port", str(self.port),
            "-t", threads, "-tb", threads, "-np", str(seqs), "-c", str(seqs * per_seq), "--no-kv-unified",
            "--no-cache-prompt", "--cache-ram", "0", "--no-webui", "--metrics", "-sps", "0",
        ]  # fmt: skip
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)  # into the peer's log
        while not self._healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with status {self.proc.returncode}")
            time.sleep(0.2)
        self.load_s = time.perf_counter() - started

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url("/health"), timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def decodes(self) -> int:
        """The server's llama_decode calls so far (its Prometheus counter)."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("llamacpp:n_decode_total"):
                    return int(float(line.split()[-1]))
        raise RuntimeError("llama-server's /metrics has no llamacpp:n_decode_total")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def complete(server: Server, request: dict[str, Any], t0: float, out: dict[str, Any]) -> None:
    """One request, streamed: its token ids and each one's arrival (seconds from ``t0``) into ``out``."""
    body = {
        "prompt": request["prompt_token_ids"],
        "n_predict": request["max_tokens"],
        "ignore_eos": True,
        "samplers": ["top_k"],
        "top_k": 1,
        "cache_prompt": False,
        "stream": True,
        "return_tokens": True,
    }
    post = urllib.request.Request(
        server.url("/completion"), json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    ids: list[int] = []
    times: list[float] = []
    with urllib.request.urlopen(post, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[len("data: ") :])
            now = time.perf_counter() - t0
            ids.extend(int(t) for t in chunk.get("tokens") or [])
            predicted = int(chunk.get("tokens_predicted", len(times)))
            times.extend([now] * (predicted - len(times)))
    out.update(
        token_ids=ids,
        token_times=times,
        end_s=time.perf_counter() - t0,
        cached_tokens=0,
        output_tokens=len(times),
    )


def run_once(server: Server, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """One repeat: every request sent at its arrival time, all in flight together."""
    answers: list[dict[str, Any]] = [{} for _ in requests]
    before = server.decodes()
    t0 = time.perf_counter()
    threads = []
    for i in sorted(range(len(requests)), key=lambda i: requests[i]["arrival_s"]):
        time.sleep(max(0.0, requests[i]["arrival_s"] - (time.perf_counter() - t0)))
        thread = threading.Thread(target=complete, args=(server, requests[i], t0, answers[i]))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if not all(answers):
        raise RuntimeError("a request to llama-server failed (see its log)")
    duration = max(a["end_s"] for a in answers)
    return {"duration_s": duration, "forwards": server.decodes() - before, "requests": answers}


def llama_bench(model: str, threads: int, long_prompts: list[int] | None = None) -> dict[str, float]:
    """llama-bench's prefill and decode tok/s on ``model``: {"pp512": ..., "tg128": ...}, and with
    ``long_prompts`` each one's prefill once ("pp4096": ...; one repeat: a 16k prefill takes minutes)."""
    figures = _llama_bench(
        model, threads, ["-p", str(BENCH_PROMPT), "-n", str(BENCH_GEN), "-r", str(BENCH_REPEATS)]
    )
    if long_prompts:
        figures |= _llama_bench(
            model, threads, ["-p", ",".join(map(str, long_prompts)), "-n", "0", "-r", "1"]
        )
    return figures


def _llama_bench(model: str, threads: int, tests: list[str]) -> dict[str, float]:
    """One llama-bench run's tests as {"pp<n>" | "tg<n>": tok/s}."""
    cmd = [str(binaries() / "llama-bench"), "-m", model, "-t", str(threads), *tests, "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    figures = {}
    for test in json.loads(proc.stdout):
        name = f"pp{test['n_prompt']}" if test["n_prompt"] else f"tg{test['n_gen']}"
        figures[name] = float(test["avg_ts"])
    return figures


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    server = Server(job)
    try:
        if job.get("warmup"):
            first = next(iter(job["runs"].values()))[0]
            warm = {"prompt_token_ids": first["prompt_token_ids"][:16], "max_tokens": 2, "arrival_s": 0.0}
            run_once(server, [warm, warm])
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in job["runs"]}
        for _ in range(job["repeat"]):
            for name, requests in job["runs"].items():
                runs[name].append(run_once(server, requests))
    finally:
        server.stop()
    version = subprocess.run([str(binaries() / "llama-server"), "--version"], capture_output=True, text=True)
    info = {
        "engine": "llama.cpp (native llama-server, llama-bench)",
        "version": (version.stdout + version.stderr).strip().splitlines()[0]
        if version.returncode == 0
        else "",
        "llama_bench": llama_bench(job["model"], job["threads"], job.get("long_prompts")),
    }
    answer = {"protocol": 1, "load_s": server.load_s, "info": info, "runs": runs}
    Path(argv[2]).write_text(json.dumps(answer), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv)
