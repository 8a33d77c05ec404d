"""A stand-in peer driver (nxctl/bench/peers/protocol.py's JSON): every request gets token 1, one token
every 10 ms; one forward per token. Run as ``python fake_peer_driver.py JOB ANSWER``."""

import json
import sys


def run(requests: list[dict]) -> dict:
    answers = [
        {
            "token_ids": [1] * r["max_tokens"],
            "token_times": [0.01 * (k + 1) for k in range(r["max_tokens"])],
            "end_s": 0.01 * r["max_tokens"],
            "cached_tokens": 0,
        }
        for r in requests
    ]
    forwards = sum(r["max_tokens"] for r in requests)
    return {"duration_s": max(a["end_s"] for a in answers), "forwards": forwards, "requests": answers}


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    runs = {name: [run(reqs) for _ in range(job["repeat"])] for name, reqs in job["runs"].items()}
    answer = {"protocol": 1, "load_s": 0.5, "info": {"engine": "fake"}, "runs": runs}
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(answer, f)
