"""The vLLM peer's driver against a stand-in `vllm` package (the parts of LLMEngine it drives: add_request,
step, has_unfinished_requests, reset_prefix_cache): its answer passes the protocol's checks, and --long's
prompts are each prefilled alone at their length, inside the engine's max_model_len."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from engine.workload import WorkloadRequest
from nxctl.bench.peers.protocol import make_job, parse_answer
from nxctl.bench.peers.registry import SPECS

DRIVER = SPECS["vllm"].driver

# one token a step per running request, (prompt sum + i) % 1000; a request's first step sleeps 1 us a
# prompt token (its prefill); every engine and request it sees is logged to NXCTL_FAKE_VLLM_LOG
FAKE_VLLM = """\
    import json, os, time
    from types import SimpleNamespace
    __version__ = "0.0-fake"
    LOG = os.environ["NXCTL_FAKE_VLLM_LOG"]

    def log(**entry):
        with open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\\n")

    class EngineArgs:
        def __init__(self, **kw):
            self.kw = kw

    class SamplingParams:
        def __init__(self, **kw):
            self.max_tokens = kw["max_tokens"]

    class LLMEngine:
        @classmethod
        def from_engine_args(cls, args):
            log(engine=args.kw)
            return cls()

        def __init__(self):
            self.running = {}

        def reset_prefix_cache(self):
            log(reset=True)

        def add_request(self, request_id, prompt, params):
            ids = prompt["prompt_token_ids"]
            log(request=request_id, length=len(ids), most=max(ids), max_tokens=params.max_tokens)
            self.running[request_id] = (ids, params.max_tokens, [])
            return request_id

        def has_unfinished_requests(self):
            return bool(self.running)

        def step(self):
            outs = []
            for rid, (ids, n, got) in list(self.running.items()):
                if not got:
                    time.sleep(len(ids) * 1e-6)
                got.append((sum(ids) + len(got)) % 1000)
                done = len(got) == n
                if done:
                    del self.running[rid]
                token_ids = list(got)
                outs.append(SimpleNamespace(request_id=rid, outputs=[SimpleNamespace(token_ids=token_ids)],
                                            num_cached_tokens=0, finished=done))
            return outs
"""

REQUESTS = [
    WorkloadRequest(0, [5, 6, 7], 4, 0.0, "default"),
    WorkloadRequest(1, [8, 9], 3, 0.02, "default"),
]


def _drive(tmp_path: Path, job: dict) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    package = tmp_path / "fake" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM), encoding="utf-8")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 300}), encoding="utf-8")
    job = job | {"model": str(folder)}
    (tmp_path / "job.json").write_text(json.dumps(job), encoding="utf-8")
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake"), "NXCTL_FAKE_VLLM_LOG": str(log)}
    cmd = [sys.executable, str(DRIVER), str(tmp_path / "job.json"), str(tmp_path / "answer.json")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, entries


def test_driver_answers_the_protocol_without_long_prompts(tmp_path: Path) -> None:
    job = make_job("model", {"dtype": "bfloat16"}, 2, 4, 1, {"workload": REQUESTS})
    done, entries = _drive(tmp_path, job)
    assert done.returncode == 0, done.stderr
    answer = parse_answer(json.loads((tmp_path / "answer.json").read_text()), job)
    assert "prefill_alone" not in answer.info
    for req, got in zip(REQUESTS, answer.runs["workload"][0].requests, strict=True):
        assert got.token_ids == [(sum(req.prompt_token_ids) + i) % 1000 for i in range(req.output_len)]
    assert entries[0]["engine"]["max_model_len"] == 64  # the workload's own length, at least 64


def test_long_prompts_are_each_prefilled_alone(tmp_path: Path) -> None:
    """--long: one request per length, that many ids inside the vocabulary, one output token, the prefix
    cache reset before it, the context long enough; the answer names pp<length> = length / TTFT."""
    job = make_job("model", {"dtype": "bfloat16"}, 2, 4, 1, {"single": REQUESTS[:1]}) | {
        "long_prompts": [4096, 16000]
    }
    done, entries = _drive(tmp_path, job)
    assert done.returncode == 0, done.stderr
    answer = parse_answer(json.loads((tmp_path / "answer.json").read_text()), job)
    assert entries[0]["engine"]["max_model_len"] == 16001
    long = [e for e in entries if str(e.get("request", "")).startswith("long-")]
    assert [(e["length"], e["max_tokens"]) for e in long] == [(4096, 1), (16000, 1)]
    assert all(e["most"] < 300 for e in long)
    before = [entries[entries.index(e) - 1] for e in long]
    assert all(e == {"reset": True} for e in before)
    figures = answer.info["prefill_alone"]
    assert set(figures) == {"pp4096", "pp16000"}
    # the stand-in's prefill sleeps 1 us a token: a rate can only come out below 1e6 tok/s
    assert all(0 < tps < 1e6 for tps in figures.values())
