"""A loopback judge for the tests: an OpenAI-compatible /v1/chat/completions endpoint on 127.0.0.1 (port 0) in a
thread, with scripted verdicts (tests/test_judge.py, tests/test_judge_train.py). No network."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JudgeServer:
    """A /v1/chat/completions endpoint on 127.0.0.1 (port 0) in a thread. `verdict(answer, reference)` gives
    the reply text, or ("status", code) for an HTTP error, or ("sleep", seconds, text) for a slow reply.
    Records every request (path, headers, body) and the most requests in flight at once."""

    def __init__(self, verdict, hold_s: float = 0.0):
        self.verdict, self.hold_s = verdict, hold_s
        self.requests: list[tuple[str, dict, dict]] = []
        self.inflight = self.max_inflight = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append((self.path, dict(self.headers), body))
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                try:
                    content = body["messages"][-1]["content"]
                    answer = re.search(r"Student's final answer: (.*)", content).group(1)
                    reference = re.search(r"Reference answer: (.*)", content).group(1)
                    out = outer.verdict(answer, reference)
                    if outer.hold_s:
                        time.sleep(outer.hold_s)
                    if isinstance(out, tuple) and out[0] == "status":
                        self.send_response(out[1])
                        self.end_headers()
                        self.wfile.write(b"server error")
                        return
                    if isinstance(out, tuple) and out[0] == "sleep":
                        time.sleep(out[1])
                        out = out[2]
                    data = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "stop"}]})
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data.encode())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)
                finally:
                    with outer.lock:
                        outer.inflight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
