"""OpenAI response bodies and stream chunks, built from engine outputs and deltas."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.loader import ChatTokenizer
from engine.outputs import RequestOutput
from nxctl import __version__
from nxctl.server.streaming import Delta
from nxctl.server.tokens import token_bytes, token_text

FINGERPRINT = f"nxctl-{__version__}"
FINISH = {"stop": "stop", "length": "length"}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_logprobs(
    tok: ChatTokenizer, ids: Sequence[int], lps: Sequence[float], tops: Sequence[Sequence[tuple[int, float]]]
) -> dict[str, Any]:
    """Chat ``logprobs``: one entry per token, with its bytes and the requested alternatives."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        return {
            "token": token_text(tok, token_id),
            "logprob": logprob,
            "bytes": list(token_bytes(tok, token_id)),
        }

    content = []
    for n, (token_id, lp) in enumerate(zip(ids, lps, strict=False)):
        alternatives = [entry(t, v) for t, v in tops[n]] if n < len(tops) else []
        content.append({**entry(token_id, lp), "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(
    tok: ChatTokenizer,
    ids: Sequence[int],
    lps: Sequence[float],
    tops: Sequence[Sequence[tuple[int, float]]],
    offset: int = 0,
) -> dict[str, Any]:
    """Legacy completions ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset (from ``offset``)."""
    tokens = [token_text(tok, t) for t in ids]
    offsets, at = [], offset
    for text in tokens:
        offsets.append(at)
        at += len(text)
    top = [{token_text(tok, t): v for t, v in tops[n]} if n < len(tops) else {} for n in range(len(ids))]
    return {
        "tokens": tokens,
        "token_logprobs": list(lps[: len(ids)]),
        "top_logprobs": top,
        "text_offset": offsets,
    }


def chat_response(
    rid: str, model: str, created: int, outs: list[RequestOutput], tok: ChatTokenizer, want_logprobs: bool
) -> dict[str, Any]:
    choices = []
    for i, out in enumerate(outs):
        lp = chat_logprobs(tok, out.token_ids, out.logprobs, out.top_logprobs) if want_logprobs else None
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": out.text},
                "logprobs": lp,
                "finish_reason": FINISH.get(out.finish_reason or "", "stop"),
            }
        )
    completion = sum(len(o.token_ids) for o in outs)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(len(outs[0].prompt_token_ids), completion),
        "system_fingerprint": FINGERPRINT,
    }


def chat_chunk(
    rid: str, model: str, created: int, choices: list[dict[str, Any]], with_usage: bool
) -> dict[str, Any]:
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def chat_delta_choice(delta: Delta, tok: ChatTokenizer, want_logprobs: bool) -> dict[str, Any]:
    lp = None
    if want_logprobs and delta.token_ids:
        lp = chat_logprobs(tok, delta.token_ids, delta.logprobs, delta.top_logprobs)
    content = {"content": delta.text} if delta.text or not delta.finish_reason else {}
    finish = FINISH.get(delta.finish_reason or "", "stop") if delta.finish_reason else None
    return {"index": delta.index, "delta": content, "logprobs": lp, "finish_reason": finish}


def completion_response(
    rid: str,
    model: str,
    created: int,
    outs: list[RequestOutput],
    tok: ChatTokenizer,
    logprobs: int | None,
    prompt_tokens: int,
) -> dict[str, Any]:
    choices = []
    for i, out in enumerate(outs):
        lp = None
        if logprobs is not None:
            lp = completion_logprobs(tok, out.token_ids, out.logprobs, out.top_logprobs)
        finish = FINISH.get(out.finish_reason or "", "stop")
        choices.append({"index": i, "text": out.text, "logprobs": lp, "finish_reason": finish})
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, sum(len(o.token_ids) for o in outs)),
        "system_fingerprint": FINGERPRINT,
    }


def error_event(message: str, status: int = 500) -> bytes:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return sse({"error": {"message": message, "type": kind, "param": None, "code": status}})
