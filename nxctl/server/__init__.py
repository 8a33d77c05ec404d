"""The HTTP seat (`nxctl serve`): OpenAI- and Ollama-compatible APIs over engine loops, glue only.

One module per API surface that generates; each reads one request top to bottom (its handler, then its
conversion, then its formatting) over the pieces every endpoint shares:

    openai_chat.py          /v1/chat/completions    messages, tools, thinking -> work; chat bodies, SSE chunks
    openai_completions.py   /v1/completions         prompts (text or ids) -> work; text_completion bodies, chunks
    openai_responses.py     /v1/responses           as a chat turn (openai_chat.chat_work); output items, events
    ollama_chat.py          /api/chat               messages, tools, truncation -> work; message bodies, NDJSON
    ollama_generate.py      /api/generate           context + prompt, truncation -> work; response bodies, NDJSON

A generation request's path: request_context.read_request (the body checked against its schema:
schemas_openai.py, schemas_ollama.py, schemas_responses.py; its id, arrival, timeline) -> seat.lease (the
model held for the request: lease.py) -> the handler's own conversion, with the shared structured_fields
(the answer's grammar and how to read it back), tool_fields, tokens, openai_sampling / ollama_sampling
(SamplingParams) -> generation.stream | collect (the jobs on the model's engine loop, read back as deltas
or final outputs) -> the handler's own formatting, with openai_shared / ollama_shared (reply, SSE or
NDJSON framing, usage, error events) and answer_reader (thinking and tool calls read out of the text).

openai_api.py      /v1/models, /v1/embeddings; ollama_api.py: /api/embed, /api/show, /api/tags, /api/ps
api_errors.py      APIError and the JSON error bodies; finish_reasons.py: engine finish reasons per API
streaming.py       deltas of a choice (stop-string hold-back); keep_alive.py: KeepAlive
settings.py        SeatSettings: every option of the seat, typed, in one place
seat.py            Seat: the seat's shared state (app.state.seat), and the lease each request takes
bridge.py          EngineLoop: one thread owns one Engine; thread-safe inbox, per-request sinks
host.py            ModelHost: engine.mux.ModelPool (the one residency driver) with Ollama names; unloads stop loops
models.py          which models a seat serves (registry or --model) and how one loads
model_info.py      what /api/show, /api/tags, /api/ps show
embeddings.py      mean-pooled input token embeddings
prometheus_metrics.py  Prometheus metrics with vLLM's names; dlq.py: the SQLite dead-letter store
timeline.py        what a traced request did; tracing.py, request_spans.py: its OpenTelemetry spans
middleware.py      body limit (413, body drained first), API key, one log line per request; drain.py
app.py             create_app(...): the FastAPI app and its lifespan
uvicorn_seat.py    run the app with uvicorn: in the foreground (signals, drain) or in a thread
"""
