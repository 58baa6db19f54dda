"""A stand-in for a rule of AWS S3 that neither Sluice's S3 API nor the RGW here enforces
(and, on request, for a network that loses a Complete's answer).

Named so, as the tooling's one mock of AWS: a forwarding proxy in front of a real origin (a
Sluice node), which passes every request on unchanged (its signature still holds: the Host
header is kept; a chunked body goes on whole, with its Content-Length) and refuses, as AWS
does, a CompleteMultipartUpload that does not name every part's checksum when its upload was
created with `x-amz-checksum-algorithm`:

    400 InvalidRequest: The upload was created using a crc32c checksum. The complete request
    must include the checksum for each part. It was missing for part 1 in the request.

(AWS's behaviour: docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html and
the answers quoted in apache/opendal#4580.) Origins that compute the missing checksums
themselves hide a client that forgets them; against AWS every such upload fails.

On request (`lacks`), it also stands in for an origin without some operations, as GCS's XML API
is without DeleteObjects (it answers `400 NotImplemented: A header or query you provided
requested a function that is not implemented.`, quoted in supabase/storage#898) and some
gateways are without UploadPartCopy: those requests get that answer and reach nothing.
"""

import http.client
import http.server
import re
import threading
import xml.etree.ElementTree as ET
from urllib.parse import parse_qs, urlsplit

HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade",
       "expect"}  # (a 100-continue is answered here; the origin gets the whole body)


def _local(tag):
    return tag.rsplit("}", 1)[-1]


class AwsRulesProxy:
    def __init__(self, origin_host, origin_port, enforce=True, lacks=()):
        """`enforce`: False to forward and count only (for an origin whose answers make the
        rule impossible to follow, as RGW's CopyPartResult, which names no checksum).
        `lacks`: operations answered NotImplemented ("DeleteObjects", "UploadPartCopy"); how
        many times each was asked is in `not_implemented`."""
        self.origin = (origin_host, origin_port)
        self.enforce = enforce
        self.lacks = set(lacks)
        self.not_implemented = {}
        self.algorithms = {}  # upload id -> checksum algorithm it was created with
        self.refused = []     # (upload id, part number) of each Complete refused
        # Completes whose answer is lost: forwarded, done by the origin, then the connection
        # closed unanswered (the client retries, and finds the upload gone).
        self.lose_completes = 0
        self.lost = 0
        # Traffic through here: request bodies sent on, answer bodies brought back, and
        # requests naming x-amz-copy-source (copies the origin makes itself).
        self.sent = 0
        self.received = 0
        self.copies = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self):
                """The request's body, whole: by Content-Length, or by its chunks
                (Transfer-Encoding: chunked, as SDKs send a stream of unknown length). The
                origin gets it with a Content-Length."""
                if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
                    n = int(self.headers.get("Content-Length") or 0)
                    return self.rfile.read(n) if n else b""
                body = bytearray()
                while True:
                    size = int(self.rfile.readline(1024).split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        return bytes(body)
                    body += self.rfile.read(size)
                    self.rfile.readline(1024)  # the CRLF after the chunk

            def _forward(self):
                body = self._body()
                url = urlsplit(self.path)
                q = parse_qs(url.query, keep_blank_values=True)
                op = None
                if self.command == "POST" and "delete" in q:
                    op = "DeleteObjects"
                elif (self.command == "PUT" and "uploadId" in q and
                      "x-amz-copy-source" in self.headers):
                    op = "UploadPartCopy"
                if op in proxy.lacks:
                    with proxy.lock:
                        proxy.not_implemented[op] = proxy.not_implemented.get(op, 0) + 1
                    return self._answer(400, (
                        "<?xml version='1.0' encoding='UTF-8'?><Error><Code>NotImplemented"
                        "</Code><Message>A header or query you provided requested a function "
                        "that is not implemented.</Message></Error>").encode(),
                        {"Content-Type": "application/xml"})
                if self.command == "POST" and "uploadId" in q and proxy.enforce:
                    refusal = proxy._check_complete(q["uploadId"][0], body)
                    if refusal:
                        return self._answer(400, refusal.encode(),
                                            {"Content-Type": "application/xml"})
                conn = http.client.HTTPConnection(*proxy.origin, timeout=120)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in HOP and k.lower() != "content-length"}
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    with proxy.lock:
                        proxy.sent += len(body)
                        proxy.received += len(data)
                        proxy.copies += "x-amz-copy-source" in self.headers
                    if self.command == "POST" and "uploadId" in q and r.status == 200:
                        with proxy.lock:
                            lose = proxy.lose_completes > 0
                            if lose:
                                proxy.lose_completes -= 1
                                proxy.lost += 1
                        if lose:
                            self.close_connection = True
                            return
                    if self.command == "POST" and "uploads" in q and r.status == 200:
                        algo = self.headers.get("x-amz-checksum-algorithm")
                        m = re.search(rb"<UploadId>([^<]+)</UploadId>", data)
                        if algo and m:
                            with proxy.lock:
                                proxy.algorithms[m.group(1).decode()] = algo.upper()
                    self._answer(r.status, data,
                                 {k: v for k, v in r.getheaders() if k.lower() not in HOP
                                  and k.lower() != "content-length"},
                                 r.getheader("Content-Length"))
                finally:
                    conn.close()

            def _answer(self, status, data, headers, head_length=None):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                # A HEAD's length is the object's, not its (empty) body's.
                length = head_length if self.command == "HEAD" and head_length else len(data)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _check_complete(self, upload_id, body):
        with self.lock:
            algo = self.algorithms.get(upload_id)
        if not algo:
            return None
        want = "Checksum" + algo
        for part in ET.fromstring(body):
            if _local(part.tag) != "Part":
                continue
            fields = {_local(c.tag): (c.text or "") for c in part}
            if not fields.get(want):
                number = fields.get("PartNumber", "?")
                with self.lock:
                    self.refused.append((upload_id, number))
                return ("<Error><Code>InvalidRequest</Code><Message>The upload was created "
                        f"using a {algo.lower()} checksum. The complete request must include "
                        "the checksum for each part. It was missing for part "
                        f"{number} in the request.</Message></Error>")
        return None

    def traffic(self):
        """(sent, received, copies) so far."""
        with self.lock:
            return self.sent, self.received, self.copies

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
