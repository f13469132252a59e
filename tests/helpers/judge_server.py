"""A loopback judge for the tests: an OpenAI-compatible /v1/chat/completions endpoint on 127.0.0.1 (port 0) in a
thread, with scripted verdicts (tests/rewards/test_judge.py, tests/train/test_judge_train.py). No network."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(text: str) -> bytes:
    """An OpenAI chat completion whose message is `text`."""
    return json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).encode()


def send_json(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    """Write a JSON reply from an http.server handler; a client that went away is no error of the server's."""
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


class JudgeServer:
    """A /v1/chat/completions endpoint on 127.0.0.1 (port 0) in a thread. `verdict(answer, reference)` gives
    the reply text, or one of:
        ("status", code)                      an HTTP error
        ("sleep", seconds, text)              a slow reply
        ("redirect", code, location)          a 3xx reply pointing at `location`
        ("big", nbytes, with_length)          a 200 reply of nbytes spaces (with or without Content-Length),
                                              written in 64 KiB pieces (`sent` counts the bytes that went out)
        ("trickle", interval_s, text, what)   the reply one byte every interval_s: what="body" (the headers at
                                              once) or "all" (the status line too); stops when the client
                                              closes or the server exits
    Records every request (path, headers, body; a GET too, answered EQUIVALENT: the "other host" of a redirect
    test) and the most requests in flight at once."""

    def __init__(self, verdict, hold_s: float = 0.0):
        self.verdict, self.hold_s = verdict, hold_s
        self.requests: list[tuple[str, dict, dict]] = []
        self.inflight = self.max_inflight = 0
        self.sent = 0
        self.lock = threading.Lock()
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                with outer.lock:
                    outer.requests.append((self.path, dict(self.headers), {}))
                send_json(self, 200, completion("EQUIVALENT"))

            def _trickle(self, payload: bytes, interval_s: float) -> None:
                for i in range(len(payload)):
                    if outer.closing.wait(interval_s):
                        return
                    self.wfile.write(payload[i:i + 1])
                    self.wfile.flush()

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append((self.path, dict(self.headers), body))
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                counted = [True]

                def done() -> None:
                    with outer.lock:
                        if counted[0]:
                            counted[0] = False
                            outer.inflight -= 1

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
                    if isinstance(out, tuple) and out[0] == "redirect":
                        self.send_response(out[1])
                        self.send_header("Location", out[2])
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if isinstance(out, tuple) and out[0] == "big":
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        if out[2]:
                            self.send_header("Content-Length", str(out[1]))
                        self.end_headers()
                        piece, left = b" " * 65536, out[1]
                        while left > 0 and not outer.closing.is_set():
                            n = min(left, len(piece))
                            self.wfile.write(piece[:n])
                            left -= n
                            with outer.lock:
                                outer.sent += n
                        return
                    if isinstance(out, tuple) and out[0] == "trickle":
                        data = completion(out[2])
                        head = (f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
                                f"Content-Length: {len(data)}\r\n\r\n").encode()
                        if out[3] == "all":
                            self._trickle(head + data, out[1])
                        else:
                            self.wfile.write(head)
                            self.wfile.flush()
                            self._trickle(data, out[1])
                        self.close_connection = True
                        return
                    if isinstance(out, tuple) and out[0] == "sleep":
                        time.sleep(out[1])
                        out = out[2]
                    data = completion(out)
                    # Out of flight before the reply can reach the client: a client that sends its next request
                    # the moment this one is answered must not find it still counted (a race under load).
                    done()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)
                finally:
                    done()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
