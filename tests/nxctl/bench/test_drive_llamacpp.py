"""The native llama.cpp peer's driver against stand-in binaries: a `llama-server` that speaks the parts of
its HTTP API the driver uses (health, Prometheus counters, streamed /completion with token ids) and a
`llama-bench` that prints its JSON. The driver's answer must pass the protocol's checks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.workload import WorkloadRequest
from nxctl.bench.peers.protocol import make_job, parse_answer
from nxctl.bench.peers.registry import SPECS

DRIVER = SPECS["llamacpp"].driver

# answers token (prompt sum + i) % 1000 for i in 0..n_predict-1, two per streamed chunk, leaving out the
# id of token 2 as llama-server does for a token whose text ends inside a UTF-8 character (the chunk's
# tokens_predicted still counts it); refuses a request that asks for prompt caching or non-greedy sampling
FAKE_SERVER = """\
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    assert "--no-cache-prompt" in args and "--metrics" in args, args
    decodes = 0

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body, kind="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, b'{"status": "ok"}')
            if self.path == "/metrics":
                return self._send(200, f"llamacpp:n_decode_total {decodes}\\n".encode(), "text/plain")
            self._send(404, b"{}")

        def do_POST(self):
            global decodes
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body["cache_prompt"] or body["samplers"] != ["top_k"] or body["top_k"] != 1:
                return self._send(400, b'{"error": "not greedy"}')
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            first = sum(body["prompt"])
            ids = [(first + i) % 1000 for i in range(body["n_predict"])]
            for at in range(0, len(ids), 2):
                decodes += 1
                shown = [t for i, t in enumerate(ids[at : at + 2], at) if i != 2]  # as a split UTF-8 character
                chunk = {"content": "", "tokens": shown, "tokens_predicted": at + len(ids[at : at + 2]), "stop": False}
                self.wfile.write(f"data: {json.dumps(chunk)}\\n\\n".encode())
                self.wfile.flush()
                time.sleep(0.005)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

# prompts of -p (comma-separated) at 150.5 tok/s less one per thousand tokens, -n tokens at 20.25 (none for 0)
FAKE_BENCH = """\
    import json, sys
    args = sys.argv[1:]
    assert args[args.index("-o") + 1] == "json"
    prompts, n = [int(p) for p in args[args.index("-p") + 1].split(",")], int(args[args.index("-n") + 1])
    tests = [{"n_prompt": p, "n_gen": 0, "avg_ts": 150.5 - p // 1000} for p in prompts]
    print(json.dumps(tests + ([{"n_prompt": 0, "n_gen": n, "avg_ts": 20.25}] if n else [])))
"""


def _binary(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body), encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _drive(tmp_path: Path, job: dict, binaries: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "job.json").write_text(json.dumps(job), encoding="utf-8")
    env = {**os.environ, "NXCTL_LLAMACPP_BIN": str(binaries)}
    cmd = [sys.executable, str(DRIVER), str(tmp_path / "job.json"), str(tmp_path / "answer.json")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


REQUESTS = [
    WorkloadRequest(0, [5, 6, 7], 5, 0.0, "default"),
    WorkloadRequest(1, [8, 9], 4, 0.05, "default"),
    WorkloadRequest(2, [1], 3, 0.0, "default"),
]


def test_driver_streams_each_request_and_reports_llama_bench(tmp_path: Path) -> None:
    binaries = tmp_path / "bin"
    binaries.mkdir()
    _binary(binaries, "llama-server", FAKE_SERVER)
    _binary(binaries, "llama-bench", FAKE_BENCH)
    runs = {"workload": REQUESTS, "single": REQUESTS[:1]}
    job = make_job("model.gguf", {}, 2, 4, 2, runs)
    done = _drive(tmp_path, job, binaries)
    assert done.returncode == 0, done.stderr
    answer = parse_answer(json.loads((tmp_path / "answer.json").read_text()), job)
    assert answer.info["llama_bench"] == {"pp512": 150.5, "tg128": 20.25}
    for repeat in answer.runs["workload"]:
        for req, got in zip(REQUESTS, repeat.requests, strict=True):
            first = sum(req.prompt_token_ids)
            assert got.token_ids == [(first + i) % 1000 for i in range(req.output_len) if i != 2]
            assert got.generated == req.output_len  # counted, though one id was not shown
            assert got.token_times is not None and len(got.token_times) == req.output_len
            assert got.token_times[0] >= req.arrival_s
        assert repeat.forwards == sum(-(-r.output_len // 2) for r in REQUESTS)  # the server's counter
    assert len(answer.runs["single"]) == 2


def test_long_prompts_are_timed_by_llama_bench_too(tmp_path: Path) -> None:
    """--long: the job's long_prompts reach llama-bench (-p 4096,16000 -n 0) beside its usual tests."""
    binaries = tmp_path / "bin"
    binaries.mkdir()
    _binary(binaries, "llama-server", FAKE_SERVER)
    _binary(binaries, "llama-bench", FAKE_BENCH)
    job = make_job("model.gguf", {}, 2, 4, 1, {"single": REQUESTS[:1]}) | {"long_prompts": [4096, 16000]}
    done = _drive(tmp_path, job, binaries)
    assert done.returncode == 0, done.stderr
    answer = parse_answer(json.loads((tmp_path / "answer.json").read_text()), job)
    assert answer.info["llama_bench"] == {"pp512": 150.5, "tg128": 20.25, "pp4096": 146.5, "pp16000": 134.5}


def test_driver_without_binaries_fails_in_one_line(tmp_path: Path) -> None:
    job = make_job("model.gguf", {}, 2, 4, 1, {"workload": REQUESTS})
    done = _drive(tmp_path, job, tmp_path / "nowhere")
    assert done.returncode != 0
    assert "no llama-server in" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "answer.json").exists()
