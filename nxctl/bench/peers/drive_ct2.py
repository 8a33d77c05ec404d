"""The CTranslate2 peer's driver: ``Generator.generate_batch`` in static batches over the bench's workload.

A plain script run by the ct2 peer's own python (standard library, ctranslate2 and, to convert,
transformers): ``python drive_ct2.py JOB.json ANSWER.json``; the JSON is nxctl/bench/peers/protocol.py's.

The HF folder is converted once (float32, as written) into ``settings["converted"]``; the compute type
(float32, int8) is chosen when the generator loads it. Batches of ``max_num_seqs`` requests in arrival
order, each started once the previous one finished and its last member arrived (as the hf peer),
generated greedily to the batch's longest output (min_length = max_length, EOS ignored); a callback
times each step's token of each request; a request completes when its batch does. Prompts of unequal
length: CTranslate2 forwards the batch's shortest prompt length at once and feeds the rest of the longer
prompts token by token in its decoding loop (its documented behaviour).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import ctranslate2


def converted(job: dict[str, Any]) -> Path:
    """The CTranslate2 model folder, converted from the job's HF folder the first time."""
    out = Path(job["settings"]["converted"])
    if (out / "model.bin").is_file():
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    ctranslate2.converters.TransformersConverter(job["model"]).convert(str(partial), force=True)
    partial.rename(out)
    return out


def generate(
    gen: Any, vocab: list[str], batch: list[dict[str, Any]], t0: float
) -> tuple[list[list[int]], list[list[float]]]:
    """One batch to its longest output; each row's token ids and token times (from ``t0``). The prompts
    go in as token strings (the generator's vocabulary: id -> string); the callback sees generated
    tokens only."""
    longest = max(r["max_tokens"] for r in batch)
    times: list[list[float]] = [[] for _ in batch]

    def on_token(step: Any) -> bool:
        times[step.batch_id].append(time.perf_counter() - t0)
        return False

    results = gen.generate_batch(
        [[vocab[t] for t in r["prompt_token_ids"]] for r in batch],
        max_length=longest,
        min_length=longest,
        sampling_topk=1,
        beam_size=1,
        include_prompt_in_result=False,
        callback=on_token,
    )
    return [list(r.sequences_ids[0]) for r in results], times


def run_once(gen: Any, vocab: list[str], requests: list[dict[str, Any]], size: int) -> dict[str, Any]:
    """One pass over ``requests`` (the protocol's repeat) in static batches of ``size``."""
    order = sorted(range(len(requests)), key=lambda i: requests[i]["arrival_s"])
    answers: list[dict[str, Any]] = [{} for _ in requests]
    batches = [order[k : k + size] for k in range(0, len(order), size)]
    t0 = time.perf_counter()
    for batch in batches:
        time.sleep(max(0.0, requests[batch[-1]]["arrival_s"] - (time.perf_counter() - t0)))
        ids, times = generate(gen, vocab, [requests[i] for i in batch], t0)
        end = time.perf_counter() - t0
        for i, row_ids, row_times in zip(batch, ids, times, strict=True):
            n = requests[i]["max_tokens"]
            answers[i] = {"token_ids": row_ids[:n], "token_times": row_times[:n], "end_s": end}
    # one forward for the prompts' common length, one per remaining prompt token, one per further output
    forwards = sum(
        max(len(requests[i]["prompt_token_ids"]) for i in b)
        - min(len(requests[i]["prompt_token_ids"]) for i in b)
        + max(requests[i]["max_tokens"] for i in b)
        for b in batches
    )
    return {
        "duration_s": max(a["end_s"] for a in answers),
        "forwards": forwards,
        "batches": batches,
        "requests": answers,
    }


def main(argv: list[str]) -> None:
    job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    started = time.perf_counter()
    model = converted(job)
    compute_type = job["settings"]["compute_type"]
    gen = ctranslate2.Generator(
        str(model), device="cpu", compute_type=compute_type, intra_threads=job["threads"], inter_threads=1
    )
    vocab = json.loads((model / "vocabulary.json").read_text(encoding="utf-8"))
    if job.get("warmup"):
        first = next(iter(job["runs"].values()))[0]
        warm = {"prompt_token_ids": first["prompt_token_ids"][:16], "max_tokens": 2, "arrival_s": 0.0}
        run_once(gen, vocab, [warm, warm], 2)
    load_s = time.perf_counter() - started
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in job["runs"]}
    for _ in range(job["repeat"]):
        for name, requests in job["runs"].items():
            runs[name].append(run_once(gen, vocab, requests, job["max_num_seqs"]))
    info = {"engine": "ctranslate2", "version": ctranslate2.__version__, "compute_type": compute_type}
    answer = {"protocol": 1, "load_s": load_s, "info": info, "runs": runs}
    Path(argv[2]).write_text(json.dumps(answer), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv)
