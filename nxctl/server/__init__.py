"""The HTTP seat (`nxctl serve`): OpenAI- and Ollama-compatible APIs over engine loops, glue only.

A generation request passes each stage once, in this order (openai_api.py / ollama_api.py conduct):

    1. request_context.py   the JSON body against its pydantic schema (schemas_openai.py, schemas_ollama.py),
                            the request's id, arrival, timeline; its log-line facts and dead letters
       lease.py             the model held for the request (ModelLease), and the stream that owns it
    2. to_engine_params.py  the API's fields as engine work: prompt token ids + SamplingParams
    3. generation.py        the jobs (Job, Work) on the model's engine loop (queue limit), their outputs
                            streamed as deltas (streaming.py: stop-string hold-back) or collected
    4. openai_format.py     OpenAI bodies and SSE chunks; ollama_format.py: Ollama bodies and NDJSON lines

Shared by the stages: seat.py (the seat's state, the lease of a model), api_errors.py (APIError and
the JSON error bodies), finish_reasons.py (engine finish reasons as the APIs name them), keep_alive.py
(KeepAlive), tokens.py (prompt rendering, Ollama truncation, token strings and bytes for logprobs).

settings.py        SeatSettings: every option of the seat, typed, in one place
bridge.py          EngineLoop: one thread owns one Engine; thread-safe inbox, per-request sinks
host.py            ModelHost: engine.mux.ModelPool (the one residency driver) with Ollama names; unloads stop loops
models.py          which models a seat serves (registry or --model) and how one loads
model_info.py      what /api/show, /api/tags, /api/ps show
embeddings.py      mean-pooled input token embeddings
prometheus_metrics.py  Prometheus metrics with vLLM's names; dlq.py: the SQLite dead-letter store
middleware.py      body limit (413, body drained first), API key, one log line per request
app.py             create_app(...): the FastAPI app and its lifespan
uvicorn_seat.py    run the app with uvicorn: in the foreground (signals, drain) or in a thread
"""
