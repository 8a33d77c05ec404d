"""`nxctl sched bench`: the scheduler measured against simpler schedules and a peer, with vLLM's metrics.

options.py (what to run) -> engine/workload.py (prompts, lengths, arrivals) -> schedules.py, peer_hf.py,
http_client.py (the runs) -> serving_metrics.py (vLLM's definitions), machine.py (FLOP/s, matmul peak, RSS),
agreement.py (bf16 vs f32) -> bench_run.py (setup, interleaved repeats) -> summary.py (aggregates, ratios, figures.py: every figure name,
flat figures, JSON) and report.py (the table).
"""
