#!/usr/bin/env python3
"""A real HTTP server answering as a cloud's instance metadata service does,
for the preemption tests: no notice at first (404 / FALSE / no events), then
the notice once --notice-after seconds have passed, or at once after SIGUSR1
(for a test that waits for its workers first). Other modes misbehave:
'hang' never answers, 'garbage' answers nonsense, 'refuse' closes at once."""
import argparse
import http.server
import json
import os
import signal
import socketserver
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--cloud", required=True, choices=["aws", "gcp", "azure", "hang", "garbage", "refuse"])
ap.add_argument("--notice-after", type=float, default=1.0)
args = ap.parse_args()
start = time.time()
forced = False


def notice_now(signum: int, frame: object) -> None:
    global forced
    forced = True


signal.signal(signal.SIGUSR1, notice_now)


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *a):
        if os.environ.get("FAKE_METADATA_LOG"):
            sys.stderr.write("fake metadata: " + (fmt % a) + "\n")

    def reply(self, code, body, ctype="text/plain", etag=None):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def notice_due(self):
        return forced or time.time() - start >= args.notice_after

    def handle_one(self):
        c = args.cloud
        if c == "hang":
            time.sleep(30)
            return
        if c == "refuse":
            self.close_connection = True
            return
        if c == "garbage":
            self.reply(200, "\x00\x01 not what you expected {[")
            return
        if c == "aws":
            if self.command == "PUT" and self.path == "/latest/api/token":
                if self.headers.get("X-aws-ec2-metadata-token-ttl-seconds") is None:
                    return self.reply(400, "missing ttl")
                return self.reply(200, "TOKEN123")
            if self.path == "/latest/meta-data/spot/instance-action":
                if self.headers.get("X-aws-ec2-metadata-token") != "TOKEN123":
                    return self.reply(401, "")
                if not self.notice_due():
                    return self.reply(404, "")
                t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
                return self.reply(200, json.dumps({"action": "terminate", "time": t}), "application/json")
            return self.reply(404, "")
        if c == "gcp":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self.reply(403, "missing Metadata-Flavor")
            if self.path.startswith("/computeMetadata/v1/instance/preempted"):
                # a long poll waits until the value changes or its timeout passes
                if "wait_for_change=true" in self.path and not self.notice_due():
                    timeout = 60.0
                    for part in self.path.split("?", 1)[1].split("&"):
                        if part.startswith("timeout_sec="):
                            timeout = float(part.split("=", 1)[1])
                    end = time.time() + timeout
                    while time.time() < end and not self.notice_due():
                        time.sleep(0.05)
                due = self.notice_due()
                return self.reply(200, "TRUE" if due else "FALSE", etag="e-true" if due else "e-false")
            if self.path.startswith("/computeMetadata/v1/instance/maintenance-event"):
                return self.reply(200, "NONE")
            return self.reply(404, "")
        if c == "azure":
            if self.headers.get("Metadata") != "true":
                return self.reply(400, "missing Metadata")
            if self.path.startswith("/metadata/scheduledevents"):
                events = []
                if self.notice_due():
                    nb = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
                    events = [{"EventId": "e1", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                               "Resources": ["vm"], "EventStatus": "Scheduled", "NotBefore": nb}]
                return self.reply(200, json.dumps({"DocumentIncarnation": 1, "Events": events}),
                                  "application/json")
            return self.reply(404, "")

    do_GET = handle_one
    do_PUT = handle_one


class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


srv = S(("127.0.0.1", 0), H)
print("listening on 127.0.0.1:%d" % srv.server_address[1], flush=True)
srv.serve_forever()
