"""A streaming OpenAI-API client that measures what it sees (for comparing with the engine's own figures).

Prompts are token-id lists, so their token counts are known exactly; no text is sent.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class RequestResult:
    prompt_len: int
    max_tokens: int
    t_send: float = 0.0
    t_first: float | None = None  # first streamed chunk carrying a token
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    usage_prompt: int | None = None
    usage_completion: int | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send


def stream_completion(
    url: str, model: str, prompt_ids: list[int], max_tokens: int, timeout_s: float = 120.0
) -> RequestResult:
    """One streamed /v1/completions request; token times from chunk arrival (logprobs tell tokens per chunk)."""
    res = RequestResult(prompt_len=len(prompt_ids), max_tokens=max_tokens)
    parts = urlsplit(url)
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "logprobs": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        res.t_send = time.time()
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return res
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = time.time()
            obj = json.loads(data)
            if obj.get("usage"):
                res.usage_prompt = obj["usage"].get("prompt_tokens")
                res.usage_completion = obj["usage"].get("completion_tokens")
            for ch in obj.get("choices") or []:
                lp = ch.get("logprobs") or {}
                n = len(lp.get("tokens") or []) or (1 if ch.get("text") else 0)
                if n:
                    if res.t_first is None:
                        res.t_first = now
                    res.chunk_times.append(now)
                    res.chunk_tokens.append(n)
        res.t_end = time.time()
    except OSError as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return res


def run_load(
    url: str,
    model: str,
    n_requests: int,
    concurrency: int,
    prompt_lens: list[int],
    max_tokens: int,
    vocab: int,
    seed: int = 0,
) -> list[RequestResult]:
    """``n_requests`` streamed requests, ``concurrency`` at a time; bounded, returns when all finished."""
    rng = random.Random(seed)
    lock = threading.Lock()
    jobs = []
    for i in range(n_requests):
        L = prompt_lens[i % len(prompt_lens)]
        with lock:
            ids = [rng.randrange(3, vocab) for _ in range(L)]  # 0..2 are special tokens
        jobs.append(ids)
    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        return list(ex.map(lambda ids: stream_completion(url, model, ids, max_tokens), jobs))


def tokens_in(results: list[RequestResult], a: float, b: float) -> tuple[int, int]:
    """(prompt tokens, generation tokens) the client saw complete in [a, b].

    Prompt tokens count at the first token of their request (the engine counts a
    prompt when its prefill is done); generation tokens at their chunk's arrival.
    """
    p = g = 0
    for r in results:
        if r.t_first is not None and a <= r.t_first <= b:
            p += r.prompt_len
        for t, n in zip(r.chunk_times, r.chunk_tokens, strict=True):
            if a <= t <= b:
                g += n
    return p, g


def run_load_for(
    url: str,
    model: str,
    duration_s: float,
    concurrency: int,
    prompt_lens: list[int],
    max_tokens: int,
    vocab: int,
    max_requests: int = 200,
    seed: int = 0,
) -> list[RequestResult]:
    """``concurrency`` workers send requests back to back until ``duration_s`` passed (at most ``max_requests``)."""
    rng = random.Random(seed)
    lock = threading.Lock()
    results: list[RequestResult] = []
    deadline = time.monotonic() + duration_s
    issued = 0

    def worker() -> None:
        nonlocal issued
        while True:
            with lock:
                if issued >= max_requests or time.monotonic() >= deadline:
                    return
                L = prompt_lens[issued % len(prompt_lens)]
                issued += 1
                ids = [rng.randrange(3, vocab) for _ in range(L)]
            r = stream_completion(url, model, ids, max_tokens)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
