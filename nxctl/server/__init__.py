"""The HTTP seat (`nxctl serve`): OpenAI- and Ollama-compatible APIs over engine loops, glue only.

settings.py        SeatSettings: every option of the seat, typed, in one place
bridge.py          EngineLoop: one thread owns one Engine; thread-safe inbox, per-request sinks
host.py            ModelHost: get-or-load a model under a memory budget (the mux's residency manager)
models.py          which models a seat serves (registry or --model) and how one loads
generation.py      one HTTP request = n engine requests (ModelLease + Generation), as async deltas
streaming.py       incremental text with stop-string hold-back
tokens.py          prompt rendering, Ollama-style truncation, token strings and bytes for logprobs
sampling.py        each API's fields and defaults as SamplingParams; context checks
schemas_openai.py  pydantic request schemas (OpenAI); schemas_ollama.py (Ollama)
openai_api.py      /v1/... routes (openai_format.py: bodies and chunks)
ollama_api.py      /api/... routes (model_info.py: what /api/show, /api/tags, /api/ps show)
embeddings.py      mean-pooled input token embeddings
handling.py        what handlers share: body parsing, queue limit, dead letters, disconnects, streams
metrics.py         Prometheus metrics with vLLM's names; dlq.py: the SQLite dead-letter store
errors.py          APIError and the JSON error bodies of each API
middleware.py      body limit, API key, one log line per request
app.py             create_app(...): the FastAPI app and its lifespan
runner.py          run the app with uvicorn: in the foreground (signals, drain) or in a thread
faults.py          FaultProxy: a loopback proxy that corrupts one chunk or drops one request (gates)
probe.py           a strict client: send one request through either API, reassemble and check it
"""
