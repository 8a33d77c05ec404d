"""`nxctl sched soak`: a real seat under a mixed, faulty load for minutes, and the books balanced after.

seat_process   the seat as a subprocess (`nxctl serve` on a free loopback port) and its models
procfs         its RSS, open fds and threads, read from /proc
prompts        seeded prompts: short ones, and long ones that exhaust a small KV pool
requests       one request of each kind through the official openai and ollama clients
hostile        bodies, names and headers a seat must refuse with a 4xx JSON error
outcome        what each request got: completed, refused, aborted (the client left), failed, lost
driver         C seeded clients for one phase, and the SIGTERM that may end it
scrape         the seat's /metrics read back as numbers
seat_log       the seat's request log, read back by X-Request-Id
checks         every request accounted for against /metrics, the DLQ, the log and /proc
run            warm-up, rounds, the SIGTERM phase, the negative control, the report
"""
