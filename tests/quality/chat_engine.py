"""A deterministic OpenAI-style chat server for the sweep tests, run by path as a ``command`` engine.

Serves ``GET /health``, ``GET /v1/models`` and ``POST /v1/chat/completions`` on --host/--port. The
answer to a conversation is a fixed function of its messages (greedy decoding of a model that
never changes), ``max_tokens`` words long, with ``usage``. Flags make it behave like the settings a
sweep meets:

    --perturb F     for a fraction F of conversations (chosen by hash) the answer differs from the
                    second word on: a setting that degrades outputs
    --rerun-perturb F
                    a conversation asked again in the same process differs (as --perturb) for a
                    fraction F of conversations: an engine that reproduces across launches and not
                    within one (transformers serve on the H200: a rerun matched 0.625)
    --oom           print PyTorch's out-of-memory line and exit 1 at start
    --unsupported   print what vLLM 0.32.0's CPU build prints when asked for an FP8 KV cache on a
                    CPU without AVX-512 (verbatim from vllm/v1/attention/backends/cpu_attn.py) and
                    exit 1 at start
    --escape S      once listening, double-fork a worker that calls setsid() (so no stop can find
                    it) and keeps the listening socket open for S seconds: a dirty stop
    --delay S       seconds each answer takes (a slower setting)
    --reject CODE   answer every chat request with HTTP CODE and --reject-message (a job the server
                    refuses: a bad sampling setting, an unknown model)
    --request-log F append the path of every POST to file F (what reached the server)
    --models-status CODE
                    answer GET /v1/models with HTTP CODE (an error page, not a list) after
                    --models-delay seconds: ``transformers serve`` answers 500 while it scans the
                    Hugging Face cache
    --served NAME   serve only the model NAME: a chat request naming another model gets vLLM's 404
                    ("The model `x` does not exist.")
    --empty-answers a last user message containing "[empty]" gets the empty answer, "[blank]" one of
                    white space only, "[empty-once]" the empty answer the first time it is asked

Everything ends by itself after --life seconds. It must not import harvest.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import signal
import sys
import threading
import time

args = None


def answer(messages: list[dict], max_tokens: int) -> str:
    key = json.dumps(messages, sort_keys=True).encode()
    digest = hashlib.sha256(key).digest()
    words = [f"w{hashlib.sha256(key + bytes([i % 256, i // 256])).digest()[0]}" for i in range(max_tokens)]
    with _answered_lock:
        again = key in _answered
        _answered.add(key)
    rerun = again and args.rerun_perturb and digest[1] / 256.0 < args.rerun_perturb
    if (rerun or args.perturb and digest[0] / 256.0 < args.perturb) and len(words) > 1:
        words[1:] = [w + "x" for w in words[1:]]
    return " ".join(words)


_answered: set[bytes] = set()
_answered_lock = threading.Lock()


_asked: dict[str, int] = {}
_asked_lock = threading.Lock()


def empty_answer(messages: list[dict], text: str, n: int) -> tuple[str, int]:
    last = str(messages[-1].get("content", ""))
    key = json.dumps(messages, sort_keys=True)
    with _asked_lock:
        _asked[key] = _asked.get(key, 0) + 1
        times = _asked[key]
    if "[empty]" in last or ("[empty-once]" in last and times == 1):
        return "", 0
    if "[blank]" in last:
        return " \n\t ", 1
    return text, n


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.partition("?")[0] == "/health":  # a health URL may carry a query (a token)
            self._send(200, {"status": "ok"})
        elif self.path.partition("?")[0] == "/v1/models":
            if args.models_status:
                time.sleep(args.models_delay)
                self._send(args.models_status, {"detail": "Internal Server Error"})
                return
            self._send(200, {"object": "list", "data": [{"id": args.served or "chat-fake", "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.partition("?")[0] != "/v1/chat/completions":
            self._send(404, {"error": "not found"})
            return
        messages = body.get("messages") or []
        if not messages:
            self._send(400, {"error": {"message": "messages must not be empty"}})
            return
        if args.request_log:
            with _asked_lock, open(args.request_log, "a") as fh:
                fh.write(self.path + "\n")
        if args.served and body.get("model") != args.served:
            self._send(404, {"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                             "type": "NotFoundError", "code": 404})
            return
        if args.reject:
            self._send(args.reject, {"error": {"message": args.reject_message, "code": args.reject}})
            return
        if args.delay:
            time.sleep(args.delay)
        n = int(body.get("max_tokens") or 16)
        text = answer(messages, n)
        if args.empty_answers:
            text, n = empty_answer(messages, text, n)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        self._send(200, {"object": "chat.completion", "model": "chat-fake",
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "length" if text.strip() else "stop"}],
                         "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                   "total_tokens": prompt_tokens + n}})

    def log_message(self, fmt: str, *a: object) -> None:
        pass


def main() -> int:
    global args
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--perturb", type=float, default=0.0)
    ap.add_argument("--rerun-perturb", type=float, default=0.0)
    ap.add_argument("--oom", action="store_true")
    ap.add_argument("--unsupported", action="store_true")
    ap.add_argument("--escape", type=float, default=0.0)
    ap.add_argument("--escape-pid-file", default=None)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--life", type=float, default=300.0)
    ap.add_argument("--reject", type=int, default=0)
    ap.add_argument("--reject-message", default="rejected")
    ap.add_argument("--empty-answers", action="store_true")
    ap.add_argument("--request-log", default=None)
    ap.add_argument("--models-status", type=int, default=0)
    ap.add_argument("--models-delay", type=float, default=0.0)
    ap.add_argument("--served", default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print(f"chat-engine: pid {os.getpid()} on {args.host}:{args.port}", flush=True)
    if args.unsupported:
        time.sleep(0.2)
        print("ERROR [core.py:843] EngineCore failed to start.\n"
              "ERROR [core.py:843] Traceback (most recent call last):\n"
              "ERROR [core.py:843] NotImplementedError: "
              "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
              flush=True)
        return 1
    if args.oom:
        time.sleep(0.2)
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        return 1
    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.timeout = 0.5
    if args.escape and os.fork() == 0:
        if os.fork() == 0:  # reparented at once, out of the group and the session, holding the socket
            os.setsid()
            if args.escape_pid_file:
                with open(args.escape_pid_file, "w") as fh:
                    fh.write(str(os.getpid()))
            time.sleep(args.escape)
            os._exit(0)
        os._exit(0)
    end = time.monotonic() + args.life
    while time.monotonic() < end:
        server.handle_request()
    return 0


if __name__ == "__main__":
    sys.exit(main())
