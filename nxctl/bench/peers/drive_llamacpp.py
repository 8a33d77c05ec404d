"""The llama.cpp peer's driver: llama-cpp-python's low-level bindings on the GGUF file itself.

A plain script run by the llamacpp peer's own python (standard library and llama_cpp only):
``python drive_llamacpp.py JOB.json ANSWER.json``; the JSON is nxctl/bench/peers/protocol.py's.

Continuous batching as llama.cpp's ``parallel`` example does it: one context with ``max_num_seqs``
sequences (each its own KV stream of ``max_model_len`` cells); a request takes a free sequence when it
has arrived, and each ``llama_decode`` carries one token of every running sequence plus the whole
prompt of every sequence admitted in this round (logits only where a token is sampled). Greedy
sampling in C (``llama_sampler_init_greedy``), exactly ``max_tokens`` tokens (EOS never checked); a
finished sequence's cells are freed. A single request is the same loop with one sequence running.
Forwards: llama_decode splits a batch into micro-batches of ``n_ubatch`` tokens, each a pass over
the weights, and the driver counts those.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp as ll

UBATCH = 512  # llama.cpp's default micro-batch


class Context:
    """The model, one context sized for the job, a token batch and a greedy sampler."""

    def __init__(self, job: dict[str, Any]) -> None:
        ll.llama_backend_init()
        mparams = ll.llama_model_default_params()
        self.model = ll.llama_model_load_from_file(job["model"].encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {job['model']}")
        self.seqs = job["max_num_seqs"]
        per_seq = 256 * math.ceil(job["max_model_len"] / 256)
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = per_seq * self.seqs
        cparams.n_batch = cparams.n_ctx  # a round may carry every admitted prompt whole
        cparams.n_ubatch = UBATCH
        cparams.n_seq_max = self.seqs
        cparams.n_threads = job["threads"]
        cparams.n_threads_batch = job["threads"]
        if hasattr(cparams, "kv_unified"):
            cparams.kv_unified = False  # one KV stream per sequence
        self.ctx = ll.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.batch = ll.llama_batch_init(cparams.n_batch, 0, 1)
        self.sampler = ll.llama_sampler_init_greedy()
        self.memory = ll.llama_get_memory(self.ctx)

    def clear(self) -> None:
        ll.llama_memory_clear(self.memory, True)

    def free(self, seq: int) -> None:
        ll.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Append one token to the batch; its index in the batch."""
        b, i = self.batch, self.batch.n_tokens
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = logits
        b.n_tokens = i + 1
        return i

    def decode(self) -> int:
        """Run the batch; the number of micro-batches (passes over the weights) it took."""
        n = self.batch.n_tokens
        rc = ll.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.batch.n_tokens = 0
        return math.ceil(n / UBATCH)

    def sample(self, index: int) -> int:
        return int(ll.llama_sampler_sample(self.sampler, self.ctx, index))


def run_once(c: Context, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """One pass over ``requests`` (the protocol's repeat): continuous batching over c.seqs sequences."""
    c.clear()
    order = sorted(range(len(requests)), key=lambda i: requests[i]["arrival_s"])
    ids: list[list[int]] = [[] for _ in requests]
    times: list[list[float]] = [[] for _ in requests]
    ends = [0.0] * len(requests)
    free = list(range(c.seqs))
    running: dict[int, int] = {}  # sequence -> request
    forwards, admitted = 0, 0
    t0 = time.perf_counter()
    while admitted < len(order) or running:
        now = time.perf_counter() - t0
        fresh = []
        while free and admitted < len(order) and requests[order[admitted]]["arrival_s"] <= now:
            seq, i = free.pop(0), order[admitted]
            running[seq] = i
            fresh.append(seq)
            admitted += 1
        if not running:
            time.sleep(max(0.0, requests[order[admitted]]["arrival_s"] - now))
            continue
        sample_at: dict[int, int] = {}
        for seq, i in running.items():
            if seq not in fresh:
                pos = len(requests[i]["prompt_token_ids"]) + len(ids[i]) - 1
                sample_at[seq] = c.add(ids[i][-1], pos, seq, True)
        for seq in fresh:
            prompt = requests[running[seq]]["prompt_token_ids"]
            for pos, token in enumerate(prompt):
                index = c.add(token, pos, seq, pos == len(prompt) - 1)
            sample_at[seq] = index
        forwards += c.decode()
        for seq, index in sample_at.items():
            i = running[seq]
            ids[i].append(c.sample(index))
            times[i].append(time.perf_counter() - t0)
            if len(ids[i]) == requests[i]["max_tokens"]:
                ends[i] = times[i][-1]
                del running[seq]
                c.free(seq)
                free.append(seq)
    return {
        "duration_s": max(ends),
        "forwards": forwards,
        "requests": [
            {"token_ids": ids[i], "token_times": times[i], "end_s": ends[i], "cached_tokens": 0}
            for i in range(len(requests))
        ],
    }


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    started = time.perf_counter()
    c = Context(job)
    if job.get("warmup"):
        first = next(iter(job["runs"].values()))[0]
        warm = {"prompt_token_ids": first["prompt_token_ids"][:16], "max_tokens": 2, "arrival_s": 0.0}
        run_once(c, [warm, warm])
    load_s = time.perf_counter() - started
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in job["runs"]}
    for _ in range(job["repeat"]):
        for name, requests in job["runs"].items():
            runs[name].append(run_once(c, requests))
    info = {
        "engine": "llama.cpp",
        "version": ll.__version__,
        "system": bytes(ll.llama_print_system_info()).decode(errors="replace").strip(" |"),
    }
    answer = {"protocol": 1, "load_s": load_s, "info": info, "runs": runs}
    Path(argv[2]).write_text(json.dumps(answer), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv)
