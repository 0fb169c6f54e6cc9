#!/usr/bin/env python3
"""test_s3's helpers around a real S3-compatible server (moto), Python's
standard library only. Three modes:

proxy  --upstream PORT [--clock-offset S]
    An HTTP proxy in front of moto that misbehaves on command. It prints
    "listening on 127.0.0.1:PORT" once ready. Control requests go to the same
    port under /__proxy/ (never forwarded, never faulted):
      POST /__proxy/fail?code=503&n=3   the next n requests get code
                                        (503 SlowDown, 500 InternalError)
      POST /__proxy/reset-part?n=1      the next n UploadPart bodies are cut
                                        halfway by a connection reset
      POST /__proxy/corrupt-part?n=1    the next n UploadPart bodies get one
                                        bit flipped on their way
      POST /__proxy/lose-complete?n=1   the next n CompleteMultipartUpload are
                                        done by moto, their replies replaced
                                        by a connection reset; a retry of one
                                        gets 404 NoSuchUpload
      POST /__proxy/delay-part?ms=100   every UploadPart waits ms before moto
      POST /__proxy/down, /__proxy/up   while down, every connection is reset
                                        (the server is gone)
      GET  /__proxy/stats               JSON: requests by kind, the most in
                                        flight at once by kind, faults made,
                                        skewed requests refused, requests
                                        with a session token or with two
                                        X-Amz-Date headers
    Requests whose X-Amz-Date is over 15 minutes from this proxy's clock
    (--clock-offset shifts it) get S3's 403 RequestTimeTooSkewed with the
    proxy's time in the Date header, as S3 answers them. A body whose
    Content-MD5 does not match gets S3's 400 BadDigest, one whose
    x-amz-content-sha256 does not, 400 XAmzContentSHA256Mismatch (moto checks
    neither).

imds   --key K --secret S --token T [--expires-in S] [--role NAME]
    An EC2 instance metadata service that speaks IMDSv2 only: a GET without a
    session token from PUT /latest/api/token gets 401. The credentials expire
    --expires-in seconds after each fetch. GET /__imds/stats: JSON counts.

setup  --moto URL --bucket B [--free N] [--no-enforce]
    Through moto's IAM and STS APIs (before authentication is enforced):
    a user with an access key and an s3:* policy, a role with the same policy
    that web identities may assume, temporary credentials of that role
    (AssumeRole, for the fake IMDS), and the bucket. Prints KEY=value lines,
    then enforces SigV4 (moto-api/reset-auth) with N free requests left
    (e.g. 1 for an unsigned AssumeRoleWithWebIdentity).
"""
import argparse
import base64
import calendar
import email.utils
import hashlib
import http.client
import http.server
import json
import re
import secrets
import socket
import struct
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade", "expect"}
SKEW_S = 15 * 60


def rst(sock):
    """Closes with a TCP reset (SO_LINGER 0), as a dying server does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


def xml_error(code, message, extra=""):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message>%s'
            "<RequestId>proxy</RequestId></Error>" % (code, message, extra)).encode()


class Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a connection reset on purpose is no error to print


def run_proxy(args):
    lock = threading.Lock()
    st = {"requests": 0, "kinds": {}, "inflight": {}, "max_inflight": {}, "injected": 0,
          "resets": 0, "skew_refused": 0, "md5_checked": 0, "md5_bad": 0, "sha_checked": 0, "sha_bad": 0, "corrupted": 0, "replies_lost": 0, "with_token": 0, "dup_date": 0, "down_resets": 0}
    completed_unseen = set()  # upload ids whose completion's reply was lost
    ctl = {"fail_code": 0, "fail_n": 0, "reset_n": 0, "corrupt_n": 0, "lose_n": 0, "delay_ms": 0, "down": False}

    def upload_id_of(path):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        return (q.get("uploadId") or [""])[0]

    def kind_of(method, path):
        u = urllib.parse.urlsplit(path)
        q = urllib.parse.parse_qs(u.query, keep_blank_values=True)
        parts = [p for p in u.path.split("/") if p]
        has_key = len(parts) > 1
        if method == "PUT" and "partNumber" in q:
            return "UploadPart"
        if method == "POST" and "uploads" in q:
            return "CreateMultipartUpload"
        if method == "POST" and "uploadId" in q:
            return "CompleteMultipartUpload"
        if method == "DELETE" and "uploadId" in q:
            return "AbortMultipartUpload"
        if method == "GET" and "uploadId" in q:
            return "ListParts"
        if method == "GET" and "list-type" in q:
            return "ListObjectsV2"
        if not has_key:
            return method + "Bucket"
        return {"PUT": "PutObject", "GET": "GetObject", "HEAD": "HeadObject",
                "DELETE": "DeleteObject"}.get(method, method)

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            pass

        def reply(self, code, body, headers=()):
            self.send_response_only(code)
            self.send_header("Server", "s3_proxy")
            self.send_header("Date", email.utils.formatdate(time.time() + args.clock_offset, usegmt=True))
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def control(self):
            u = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(u.query))
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            op = u.path[len("/__proxy/"):]
            with lock:
                if op == "fail":
                    ctl["fail_code"], ctl["fail_n"] = int(q.get("code", 503)), int(q.get("n", 1))
                elif op == "reset-part":
                    ctl["reset_n"] = int(q.get("n", 1))
                elif op == "corrupt-part":
                    ctl["corrupt_n"] = int(q.get("n", 1))
                elif op == "lose-complete":
                    ctl["lose_n"] = int(q.get("n", 1))
                elif op == "delay-part":
                    ctl["delay_ms"] = int(q.get("ms", 0))
                elif op in ("down", "up"):
                    ctl["down"] = op == "down"
                elif op != "stats":
                    self.reply(404, b"no such control\n")
                    return
                body = json.dumps(st).encode()
            self.reply(200, body, [("Content-Type", "application/json")])

        def handle_expect_100(self):
            # the skew check before the body, as S3 does it
            if self.skewed():
                self.refuse_skewed()
                return False
            return super().handle_expect_100()

        def skewed(self):
            d = self.headers.get("X-Amz-Date")
            if not d or self.path.startswith("/__proxy/"):
                return False
            try:
                t = calendar.timegm(time.strptime(d.split(",")[0].strip(), "%Y%m%dT%H%M%SZ"))
            except ValueError:
                return False
            return abs(t - (time.time() + args.clock_offset)) > SKEW_S

        def refuse_skewed(self):
            with lock:
                st["skew_refused"] += 1
            self.close_connection = True
            self.reply(403, xml_error("RequestTimeTooSkewed",
                                      "The difference between the request time and the current "
                                      "time is too large.", "<MaxAllowedSkewMilliseconds>900000"
                                      "</MaxAllowedSkewMilliseconds>"),
                       [("Content-Type", "application/xml"), ("Connection", "close")])

        def forward(self):
            if self.path.startswith("/__proxy/"):
                self.control()
                return
            kind = kind_of(self.command, self.path)
            with lock:
                down = ctl["down"]
                if down:
                    st["down_resets"] += 1
            if down:
                self.close_connection = True
                rst(self.connection)
                return
            with lock:
                st["requests"] += 1
                st["kinds"][kind] = st["kinds"].get(kind, 0) + 1
                st["inflight"][kind] = st["inflight"].get(kind, 0) + 1
                st["max_inflight"][kind] = max(st["max_inflight"].get(kind, 0), st["inflight"][kind])
                if self.headers.get("x-amz-security-token"):
                    st["with_token"] += 1
                if len(self.headers.get_all("X-Amz-Date") or []) > 1:
                    st["dup_date"] += 1
                fail = ctl["fail_n"] > 0
                if fail:
                    ctl["fail_n"] -= 1
                    st["injected"] += 1
                    code = ctl["fail_code"]
                flip = kind == "UploadPart" and ctl["corrupt_n"] > 0
                if flip:
                    ctl["corrupt_n"] -= 1
                    st["corrupted"] += 1
                cut = kind == "UploadPart" and ctl["reset_n"] > 0
                if cut:
                    ctl["reset_n"] -= 1
                    st["resets"] += 1
                delay = ctl["delay_ms"] if kind == "UploadPart" else 0
            try:
                self.forward_one(kind, fail and code, cut, delay, flip)
            finally:
                with lock:
                    st["inflight"][kind] -= 1

        def forward_one(self, kind, fail_code, cut, delay, flip=False):
            if kind == "CompleteMultipartUpload":
                with lock:
                    gone = upload_id_of(self.path) in completed_unseen
                if gone:  # S3 may answer a completed upload's retry so
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    self.reply(404, xml_error("NoSuchUpload", "The specified upload does not exist."),
                               [("Content-Type", "application/xml")])
                    return
            if self.skewed():  # no Expect: 100-continue (small bodies)
                self.refuse_skewed()
                return
            n = int(self.headers.get("Content-Length") or 0)
            if cut:
                self.rfile.read(n // 2)
                self.close_connection = True
                rst(self.connection)
                return
            body = self.rfile.read(n) if n else b""
            if flip and body:  # one bit damaged on the way, as a bad NIC or switch would
                body = bytes([body[0] ^ 1]) + body[1:]
            sha = self.headers.get("x-amz-content-sha256", "")
            if re.fullmatch(r"[0-9a-f]{64}", sha):
                # S3 checks a signed payload's hash (moto does not): 400
                ok = hashlib.sha256(body).hexdigest() == sha
                with lock:
                    st["sha_checked" if ok else "sha_bad"] += 1
                if not ok:
                    self.reply(400, xml_error("XAmzContentSHA256Mismatch", "The provided "
                                              "'x-amz-content-sha256' header does not match what "
                                              "was computed."),
                               [("Content-Type", "application/xml")])
                    return
            md5 = self.headers.get("Content-MD5")
            if md5 is not None:
                # S3 checks Content-MD5 (moto does not): 400 BadDigest
                ok = base64.b64encode(hashlib.md5(body).digest()).decode() == md5.strip()
                with lock:
                    st["md5_checked" if ok else "md5_bad"] += 1
                if not ok:
                    self.reply(400, xml_error("BadDigest", "The Content-MD5 you specified did not "
                                              "match what we received."),
                               [("Content-Type", "application/xml")])
                    return
            if fail_code:
                name = {503: "SlowDown", 500: "InternalError"}.get(fail_code, "InternalError")
                self.reply(fail_code, xml_error(name, "injected by s3_proxy"),
                           [("Content-Type", "application/xml")])
                return
            if delay:
                time.sleep(delay / 1000.0)
            try:
                up = http.client.HTTPConnection("127.0.0.1", args.upstream, timeout=60)
                up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in HOP and k.lower() != "content-length":
                        up.putheader(k, v)
                if n or self.command in ("PUT", "POST"):
                    up.putheader("Content-Length", str(len(body)))
                up.endheaders(body)
                resp = up.getresponse()
                data = resp.read()
            except OSError:
                # moto is not there: the client sees what it would see of a dead server
                self.close_connection = True
                rst(self.connection)
                return
            if (resp.status == 500 and kind in ("UploadPart", "CompleteMultipartUpload")
                    and b"<Error>" not in data):
                # moto 5.2.5 crashes (KeyError: a 500 HTML page) on a part or
                # completion of an upload it does not know, where S3 answers
                # 404 NoSuchUpload; answer as S3 when moto's ListParts agrees
                if self.upload_unknown():
                    self.reply(404, xml_error("NoSuchUpload", "The specified upload does not exist."),
                               [("Content-Type", "application/xml")])
                    up.close()
                    return
            if kind == "CompleteMultipartUpload" and resp.status == 200:
                with lock:
                    lose = ctl["lose_n"] > 0
                    if lose:
                        ctl["lose_n"] -= 1
                        st["replies_lost"] += 1
                if lose:  # done at the server, the reply lost on its way back
                    with lock:
                        completed_unseen.add(upload_id_of(self.path))
                    self.close_connection = True
                    rst(self.connection)
                    return
            self.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP and k.lower() not in ("content-length", "date", "server"):
                    self.send_header(k, v)
            self.send_header("Date", email.utils.formatdate(time.time() + args.clock_offset, usegmt=True))
            self.send_header("Content-Length", resp.getheader("Content-Length") or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            up.close()

        def upload_unknown(self):
            u = urllib.parse.urlsplit(self.path)
            q = urllib.parse.parse_qs(u.query)
            path = u.path + "?" + urllib.parse.urlencode({"uploadId": q.get("uploadId", [""])[0]})
            try:
                c = http.client.HTTPConnection("127.0.0.1", args.upstream, timeout=20)
                c.request("GET", path)
                r = c.getresponse()
                body = r.read()
                c.close()
            except OSError:
                return False
            return r.status == 404 and b"<Code>NoSuchUpload</Code>" in body

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

    srv = Quiet(("127.0.0.1", 0), H)
    print("listening on 127.0.0.1:%d" % srv.server_address[1], flush=True)
    srv.serve_forever()


def run_imds(args):
    lock = threading.Lock()
    st = {"token_puts": 0, "v1_refused": 0, "creds_gets": 0}
    tokens = set()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            pass

        def reply(self, code, body, ctype="text/plain"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self):
            if self.path != "/latest/api/token":
                self.reply(404, "not found")
                return
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if not ttl or not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                self.reply(400, "missing or invalid X-aws-ec2-metadata-token-ttl-seconds")
                return
            t = secrets.token_urlsafe(32)
            with lock:
                tokens.add(t)
                st["token_puts"] += 1
            self.reply(200, t)

        def do_GET(self):
            if self.path == "/__imds/stats":
                with lock:
                    self.reply(200, json.dumps(st), "application/json")
                return
            with lock:
                ok = self.headers.get("X-aws-ec2-metadata-token") in tokens
                if not ok:
                    st["v1_refused"] += 1
            if not ok:
                self.reply(401, "")  # IMDSv1 is off on this instance
                return
            base = "/latest/meta-data/iam/security-credentials/"
            if self.path == base:
                self.reply(200, args.role)
            elif self.path == base + args.role:
                with lock:
                    st["creds_gets"] += 1
                exp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + args.expires_in))
                self.reply(200, json.dumps({
                    "Code": "Success", "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "Type": "AWS-HMAC", "AccessKeyId": args.key, "SecretAccessKey": args.secret,
                    "Token": args.token, "Expiration": exp}), "application/json")
            else:
                self.reply(404, "not found")

    srv = Quiet(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    print("listening on 127.0.0.1:%d" % srv.server_address[1], flush=True)
    srv.serve_forever()


def run_setup(args):
    def call(service, params):
        # Unsigned as far as moto cares (auth is not enforced yet); the
        # credential scope names the service moto routes the request to.
        data = urllib.parse.urlencode(params).encode()
        auth = ("AWS4-HMAC-SHA256 Credential=AKIASETUP/20240101/us-east-1/%s/aws4_request, "
                "SignedHeaders=host, Signature=0" % service)
        req = urllib.request.Request(args.moto + "/", data=data, method="POST", headers={
            "Authorization": auth, "Content-Type": "application/x-www-form-urlencoded"})
        return urllib.request.urlopen(req, timeout=20).read().decode()

    def tag(xml, name):
        m = re.search("<%s>([^<]*)</%s>" % (name, name), xml)
        if not m:
            sys.exit("setup: no <%s> in %s" % (name, xml[:300]))
        return m.group(1)

    out = {}
    if not args.no_enforce:
        policy = json.dumps({"Version": "2012-10-17",
                             "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})
        trust = json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": "arn:aws:iam::123456789012:oidc-provider/oidc.test"},
            "Action": ["sts:AssumeRoleWithWebIdentity", "sts:AssumeRole"]}]})
        iam = {"Version": "2010-05-08"}
        call("iam", dict(iam, Action="CreateUser", UserName="ckpt"))
        call("iam", dict(iam, Action="PutUserPolicy", UserName="ckpt", PolicyName="s3", PolicyDocument=policy))
        x = call("iam", dict(iam, Action="CreateAccessKey", UserName="ckpt"))
        out["KEY"], out["SECRET"] = tag(x, "AccessKeyId"), tag(x, "SecretAccessKey")
        x = call("iam", dict(iam, Action="CreateRole", RoleName="ckpt-role", AssumeRolePolicyDocument=trust))
        out["ROLE_ARN"] = tag(x, "Arn")
        call("iam", dict(iam, Action="PutRolePolicy", RoleName="ckpt-role", PolicyName="s3", PolicyDocument=policy))
        x = call("sts", {"Version": "2011-06-15", "Action": "AssumeRole", "RoleArn": out["ROLE_ARN"],
                         "RoleSessionName": "imds", "DurationSeconds": "3600"})
        out["STS_KEY"], out["STS_SECRET"] = tag(x, "AccessKeyId"), tag(x, "SecretAccessKey")
        out["STS_TOKEN"] = tag(x, "SessionToken")
    if args.bucket:
        urllib.request.urlopen(urllib.request.Request(args.moto + "/" + args.bucket, method="PUT"),
                               timeout=20).read()
    if not args.no_enforce:
        req = urllib.request.Request(args.moto + "/moto-api/reset-auth", data=str(args.free).encode(),
                                     method="POST", headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=20).read()
    for k, v in out.items():
        print("%s=%s" % (k, v))
    print("SETUP=ok", flush=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("proxy")
    p.add_argument("--upstream", type=int, required=True)
    p.add_argument("--clock-offset", type=float, default=0.0)
    i = sub.add_parser("imds")
    i.add_argument("--key", required=True)
    i.add_argument("--secret", required=True)
    i.add_argument("--token", required=True)
    i.add_argument("--role", default="ckpt-node-role")
    i.add_argument("--expires-in", type=float, default=3600.0)
    s = sub.add_parser("setup")
    s.add_argument("--moto", required=True)
    s.add_argument("--bucket", default="")
    s.add_argument("--free", type=int, default=0)
    s.add_argument("--no-enforce", action="store_true")
    args = ap.parse_args()
    {"proxy": run_proxy, "imds": run_imds, "setup": run_setup}[args.mode](args)


if __name__ == "__main__":
    main()
