"""S3 counted at the HTTP level: a reverse proxy on 127.0.0.1 in front of a real S3 server (moto,
SeaweedFS) that forwards every request and response byte for byte and records each request as the S3
operation it is. It sees what the Python-level ``Counting`` storage (support/storage.py) cannot:
delta-rs (Rust object_store), pyiceberg's pyarrow FileIO, Spark executors, the CLI in a child process:
any client given ``counter.endpoint`` as its S3 endpoint.

    with S3Counter(server.endpoint) as counter:        # or counted_root(request, server) in a test
        with counter.counting() as tally:
            s3.put_object(Bucket=bucket, Key="a", Body=b"1")
        assert tally.kinds == {"PUT": 1} and tally.keys("PUT") == ["a"]

Forwarding: each client connection gets its own upstream connection; request heads (method, target,
every header, Host included) and bodies (Content-Length or chunked, framing and all) go upstream as
the client sent them, responses (1xx, 304, 404, 412, ...) come back as the server sent them. The Host
header is not rewritten, so a SigV4 signature the client made for the proxy's host:port verifies on
the server (SeaweedFS checks it; moto does not). Path-style addressing (what every client uses for an
IP endpoint); a virtual-hosted ``bucket.localhost`` Host is understood too.

Kinds, as S3 bills requests (``KIND_OF`` per operation):

- GET: GetObject (ranged or not), and the other reads of one object's or bucket's settings;
- HEAD: HeadObject, HeadBucket;
- PUT: PutObject (conditional ones too: ``condition`` keeps their If-* headers), UploadPart,
  CopyObject, UploadPartCopy, CreateBucket and the other PUTs;
- POST: CreateMultipartUpload, CompleteMultipartUpload and other POSTs (billed as PUT, shown apart);
- DELETE: DeleteObject, AbortMultipartUpload, DeleteBucket, and DeleteObjects (POST ?delete, one
  request; ``deleted`` holds the number of keys it names);
- LIST: ListObjectsV2, ListObjects, ListObjectVersions, ListMultipartUploads, ListParts, ListBuckets.

Each request's ``key`` is the object's (URL-decoded, without the bucket), a listing's the prefix it
lists, "" for the other operations on a bucket. A request is recorded (``S3Request``) when its head
arrives, before it is forwarded; its status when the response's head arrives, before the client sees
it; its bytes before each piece is forwarded. So once a synchronous client call returns, its requests
are complete in the log. ``bytes_in`` is the request body (into S3), ``bytes_out`` the response body
(out of S3), both without HTTP's chunk framing (an aws-chunked body's signatures count: they are the
body). Thread-safe. ``mark()``/``since(mark)`` or ``with counter.counting() as tally`` give a ``Tally``
of one stretch: ``kinds`` (a Counter by kind), ``ops`` (by operation), ``requests``, ``keys(kind)``,
``of(kind)``, ``bytes_in``/``bytes_out``, ``tally["PUT"]``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import socketserver
import threading
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

GET, HEAD, PUT, POST, DELETE, LIST, OTHER = "GET", "HEAD", "PUT", "POST", "DELETE", "LIST", "OTHER"
KINDS = (GET, HEAD, PUT, POST, DELETE, LIST)
BUFFER = 256 * 1024
MAX_HEAD = 64 * 1024
BODY_GRACE_S = 1.0  # a response that came before its request's body was sent: how long to wait for the body

KIND_OF = {
    "ListBuckets": LIST,
    "ListObjectsV2": LIST,
    "ListObjects": LIST,
    "ListObjectVersions": LIST,
    "ListMultipartUploads": LIST,
    "ListParts": LIST,
    "GetObject": GET,
    "HeadObject": HEAD,
    "HeadBucket": HEAD,
    "PutObject": PUT,
    "UploadPart": PUT,
    "UploadPartCopy": PUT,
    "CopyObject": PUT,
    "CreateBucket": PUT,
    "CreateMultipartUpload": POST,
    "CompleteMultipartUpload": POST,
    "DeleteObjects": DELETE,
    "DeleteObject": DELETE,
    "AbortMultipartUpload": DELETE,
    "DeleteBucket": DELETE,
}


@dataclass(eq=False)
class S3Request:
    """One request the proxy forwarded."""

    kind: str  # GET, HEAD, PUT, POST, DELETE, LIST (OTHER: a method S3 does not have)
    op: str  # the S3 operation: GetObject, ListObjectsV2, UploadPart, ... (GetBucketAcl-like for settings)
    method: str
    bucket: str
    key: str  # a listing's: the prefix listed; "" for the other operations of a bucket (or of the service)
    query: str
    condition: str = ""  # the If-* headers it carried ("If-None-Match: *"), for conditional reads and writes
    status: int | None = None  # None: no response (yet)
    bytes_in: int = 0  # request body (uploaded)
    bytes_out: int = 0  # response body (downloaded)
    deleted: int = 0  # DeleteObjects: the keys it names
    body_sent: threading.Event = field(default_factory=threading.Event, repr=False)

    def __str__(self) -> str:
        extra = f" ({self.deleted} keys)" if self.op == "DeleteObjects" else ""
        cond = f" [{self.condition}]" if self.condition else ""
        return f"{self.kind} {self.op} {self.bucket}/{self.key}{cond} -> {self.status}{extra} in={self.bytes_in} out={self.bytes_out}"


class Tally:
    """The requests of one stretch of the log: live while its ``counting()`` block runs, fixed after it."""

    def __init__(self, log: list[S3Request], lock: threading.Lock, start: int, end: int | None = None):
        self._log, self._lock, self._start, self._end = log, lock, start, end

    @property
    def requests(self) -> list[S3Request]:
        with self._lock:
            return self._log[self._start : self._end]

    @property
    def kinds(self) -> Counter:
        """Requests per kind: ``{"GET": 3, "PUT": 2}``."""
        return Counter(r.kind for r in self.requests)

    @property
    def ops(self) -> Counter:
        """Requests per S3 operation: ``{"GetObject": 3, "PutObject": 1, "UploadPart": 1}``."""
        return Counter(r.op for r in self.requests)

    def __getitem__(self, kind: str) -> int:
        return self.kinds[kind]

    def __len__(self) -> int:
        return len(self.requests)

    def of(self, kind: str) -> list[S3Request]:
        return [r for r in self.requests if r.kind == kind or r.op == kind]

    def keys(self, kind: str | None = None) -> list[str]:
        """The keys of the requests of ``kind`` (a kind or an operation; all when None), in order."""
        return [r.key for r in (self.requests if kind is None else self.of(kind))]

    @property
    def bytes_in(self) -> int:
        return sum(r.bytes_in for r in self.requests)

    @property
    def bytes_out(self) -> int:
        return sum(r.bytes_out for r in self.requests)

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.kinds.items()))
        return f"{len(self)} requests ({kinds}), {self.bytes_in:,} B in, {self.bytes_out:,} B out"

    def __repr__(self) -> str:
        return f"Tally({self.summary()})"


class S3Counter:
    """A counting reverse proxy on 127.0.0.1 (a free port) in front of the S3 server at ``upstream``
    (``http://host:port``). ``start()``/``stop()``, or use it as a context manager."""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = upstream
        self._upstream_address = (parts.hostname, parts.port)
        self._log: list[S3Request] = []
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    # -- life ------------------------------------------------------------------------------------------
    def start(self) -> S3Counter:
        counter = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                counter._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            block_on_close = False
            allow_reuse_address = True
            request_queue_size = 256  # Spark executors and delta-rs open many connections at once

        self._server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="s3-counter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.shut()
        self._server = None

    def __enter__(self) -> S3Counter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what was counted ------------------------------------------------------------------------------
    def mark(self) -> int:
        """A point in the log: ``since(mark)`` gives the requests that came after it."""
        with self._lock:
            return len(self._log)

    def since(self, mark: int = 0) -> Tally:
        """The requests after ``mark`` (0: every request), as of now."""
        with self._lock:
            return Tally(self._log, self._lock, mark, len(self._log))

    @contextlib.contextmanager
    def counting(self) -> Iterator[Tally]:
        """``with counter.counting() as tally:``: the requests made inside the block (fixed when it ends)."""
        tally = Tally(self._log, self._lock, self.mark())
        try:
            yield tally
        finally:
            tally._end = self.mark()

    @property
    def requests(self) -> list[S3Request]:
        with self._lock:
            return list(self._log)

    def clear(self) -> None:
        """Forget every request so far (marks taken before become invalid)."""
        with self._lock:
            self._log.clear()

    # -- forwarding ------------------------------------------------------------------------------------
    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream_address, timeout=30)
        except OSError:
            client.close()  # the client sees a closed connection, as it would without the proxy
            return
        upstream.settimeout(None)
        connection = _Connection(client, upstream)
        with self._lock:
            self._connections.add(connection)
        responses = threading.Thread(target=self._responses, args=(connection,), name="s3-counter-responses", daemon=True)
        responses.start()
        try:
            self._requests(connection)
        except (OSError, ValueError):  # a peer went away, or spoke no HTTP: the connection is over
            connection.shut()
        except BaseException:
            connection.shut()
            raise
        finally:
            responses.join()
            connection.close()
            with self._lock:
                self._connections.discard(connection)

    def _requests(self, connection: _Connection) -> None:
        """Client to server: each request's head recorded, then forwarded with its body."""
        reader = _Reader(connection.client)
        while True:
            head = reader.head()
            if head is None:  # the client is done: so is the server's side
                connection.upstream.shutdown(socket.SHUT_WR)
                return
            request_line, headers = _parse_head(head)
            method, target, _ = request_line.split(" ", 2)
            request = classify(method, target, headers)
            with self._lock:
                self._log.append(request)
            connection.pending.append(request)
            connection.upstream.sendall(head)
            kept = bytearray() if request.op == "DeleteObjects" else None
            _relay_body(reader, connection.upstream, _request_framing(headers), request, "bytes_in", kept)
            if kept is not None:
                request.deleted = kept.count(b"<Key>")
            request.body_sent.set()

    def _responses(self, connection: _Connection) -> None:
        """Server to client: each response forwarded, its status and bytes recorded on its request."""
        reader = _Reader(connection.upstream)
        try:
            while True:
                head = reader.head()
                if head is None:
                    break
                status_line, headers = _parse_head(head)
                status = int(status_line.split(" ", 2)[1])
                if status < 200:  # 100 Continue: the final response follows
                    connection.client.sendall(head)
                    continue
                request = connection.pending.popleft()
                request.status = status
                connection.client.sendall(head)
                framing = _response_framing(request.method, status, headers)
                _relay_body(reader, connection.client, framing, request, "bytes_out")
                if framing == "close" or "close" in headers.get("connection", "").lower():
                    break
                if not request.body_sent.wait(BODY_GRACE_S):
                    break  # answered before its body came (a refused Expect: 100-continue): the framing is lost, close
        except (OSError, ValueError, IndexError):
            pass
        finally:
            connection.shut()


class _Connection:
    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.pending: deque[S3Request] = deque()  # requests forwarded, awaiting their response
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a head and its body go out at once

    def shut(self) -> None:
        """Wake both directions' readers: the connection is over."""
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.shut()
        self.client.close()
        self.upstream.close()


class _Reader:
    """Buffered reads of one socket: heads, lines and bodies."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(BUFFER)
        self.buffer += data
        return bool(data)

    def _until(self, end: bytes, limit: int) -> bytes | None:
        while (at := self.buffer.find(end)) < 0:
            if len(self.buffer) > limit:
                raise ValueError("HTTP head or line too long")
            if not self._fill():
                if self.buffer:
                    raise ValueError("connection closed in the middle of a head or line")
                return None
        found, self.buffer = self.buffer[: at + len(end)], self.buffer[at + len(end) :]
        return found

    def head(self) -> bytes | None:
        """Through the blank line that ends it; None when the peer closed between messages."""
        while self.buffer.startswith(b"\r\n"):  # stray CRLFs between messages are allowed
            self.buffer = self.buffer[2:]
        return self._until(b"\r\n\r\n", MAX_HEAD)

    def line(self) -> bytes:
        line = self._until(b"\r\n", MAX_HEAD)
        if line is None:
            raise ValueError("connection closed in the middle of a chunked body")
        return line

    def some(self, limit: int) -> bytes:
        """Up to ``limit`` bytes (at least one); b"" at the end of the stream."""
        if not self.buffer and not self._fill():
            return b""
        piece, self.buffer = self.buffer[:limit], self.buffer[limit:]
        return piece


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """The first line and the headers (names lowercased, repeated ones joined by commas)."""
    first, *lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return first, headers


def _chunked(headers: dict[str, str]) -> bool:
    codings = [c.strip().lower() for c in headers.get("transfer-encoding", "").split(",") if c.strip()]
    return bool(codings) and codings[-1] == "chunked"


def _request_framing(headers: dict[str, str]) -> str | int:
    if _chunked(headers):
        return "chunked"
    return int(headers.get("content-length", "0") or 0)


def _response_framing(method: str, status: int, headers: dict[str, str]) -> str | int:
    if method == "HEAD" or status in (204, 304):
        return 0
    if _chunked(headers):
        return "chunked"
    if "content-length" in headers:
        return int(headers["content-length"])
    return "close"  # the body runs to the end of the connection


def _relay_body(reader: _Reader, dest: socket.socket, framing: str | int, request: S3Request, counter: str, kept=None) -> None:
    """Forward one body as framed, counting its bytes (chunk framing aside) on ``request`` before sending them."""

    def relay(size: int | None) -> None:  # None: to the end of the stream
        left = size
        while left is None or left > 0:
            piece = reader.some(BUFFER if left is None else min(left, BUFFER))
            if not piece:
                if left is None:
                    return
                raise ValueError("connection closed in the middle of a body")
            setattr(request, counter, getattr(request, counter) + len(piece))
            if kept is not None:
                kept.extend(piece)
            dest.sendall(piece)
            if left is not None:
                left -= len(piece)

    if framing == "close":
        relay(None)
    elif framing == "chunked":
        while True:
            size_line = reader.line()
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            dest.sendall(size_line)
            if size == 0:
                while (trailer := reader.line()) != b"\r\n":
                    dest.sendall(trailer)
                dest.sendall(trailer)
                return
            relay(size)
            dest.sendall(reader.line())  # the CRLF after the chunk's data
    else:
        relay(framing)


# -- which S3 operation a request is ----------------------------------------------------------------
SUBRESOURCES = {"accelerate", "acl", "analytics", "attributes", "cors", "encryption", "intelligent-tiering", "inventory", "legal-hold",
                "lifecycle", "location", "logging", "metrics", "notification", "object-lock", "ownershipControls", "policy",
                "policyStatus", "publicAccessBlock", "replication", "requestPayment", "retention", "tagging", "torrent", "versioning",
                "website"}  # fmt: skip
BUCKET_LISTS = {"uploads": "ListMultipartUploads", "versions": "ListObjectVersions"}


def classify(method: str, target: str, headers: dict[str, str]) -> S3Request:
    """The request a head names (``headers``' names lowercased): its kind, operation, bucket and key."""
    bucket, key, query = _address(target, headers.get("host", ""))
    names = {name for name, _ in parse_qsl(query, keep_blank_values=True)}
    op = _operation(method, bucket, key, names, "x-amz-copy-source" in headers)
    conditions = ("if-match", "if-none-match", "if-modified-since", "if-unmodified-since")
    condition = ", ".join(f"{name.title()}: {headers[name]}" for name in conditions if name in headers)
    kind = KIND_OF.get(op) or (method if method in (GET, HEAD, PUT, POST, DELETE) else OTHER)
    if kind == LIST and not key:
        key = dict(parse_qsl(query)).get("prefix", "")
    return S3Request(kind, op, method, bucket, key, query, condition)


def _address(target: str, host: str) -> tuple[str, str, str]:
    """(bucket, key, query) of a request target: path-style, or virtual-hosted when the Host names a bucket."""
    if "://" in target:  # absolute-form
        parts = urlsplit(target)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
    path, _, query = target.partition("?")
    path = unquote(path)
    name = host.rsplit(":", 1)[0]
    if _is_bucket_host(name):
        return name.split(".", 1)[0], path.lstrip("/"), query
    bucket, _, key = path.lstrip("/").partition("/")
    return bucket, key, query


def _is_bucket_host(name: str) -> bool:
    """bucket.localhost, bucket.s3.example.com; not an IP address or a bare name."""
    if "." not in name or name.startswith("["):
        return False
    try:
        ipaddress.ip_address(name)
        return False
    except ValueError:
        return True


def _operation(method: str, bucket: str, key: str, names: set[str], copy: bool) -> str:
    setting = next((name for name in sorted(names) if name in SUBRESOURCES), "")
    setting = "".join(part[0].upper() + part[1:] for part in setting.split("-")) if setting else ""
    if not bucket:
        return "ListBuckets" if method == "GET" else f"{method.title()}Service"
    if method == "GET":
        if key:
            return "ListParts" if "uploadId" in names else f"GetObject{setting}"
        if "list-type" in names:
            return "ListObjectsV2"
        listed = next((op for name, op in BUCKET_LISTS.items() if name in names), None)
        return listed or (f"GetBucket{setting}" if setting else "ListObjects")
    if method == "HEAD":
        return "HeadObject" if key else "HeadBucket"
    if method == "PUT":
        if not key:
            return f"PutBucket{setting}" if setting else "CreateBucket"
        if "partNumber" in names and "uploadId" in names:
            return "UploadPartCopy" if copy else "UploadPart"
        return "CopyObject" if copy else f"PutObject{setting}"
    if method == "POST":
        if not key and "delete" in names:
            return "DeleteObjects"
        if "uploads" in names:
            return "CreateMultipartUpload"
        if "uploadId" in names:
            return "CompleteMultipartUpload"
        return "RestoreObject" if "restore" in names else "SelectObjectContent" if "select" in names else "PostObject"
    if method == "DELETE":
        if key:
            return "AbortMultipartUpload" if "uploadId" in names else f"DeleteObject{setting}"
        return f"DeleteBucket{setting}"
    return f"{method.title()}Request"


# -- for tests: a counted S3 root --------------------------------------------------------------------
class CountedRoot:
    """A fresh bucket reached through a counting proxy: ``url``, ``options`` (what ``open_storage`` and
    ``S3Storage`` take, ``endpoint_url`` the proxy's) and ``counter``. Unpacks as ``url, options`` like
    ``new_bucket``'s answer, so ``support.lakes.s3_lake_at(root)`` gives a lake whose every request is counted."""

    def __init__(self, url: str, options: dict, counter: S3Counter):
        self.url, self.options, self.counter = url, options, counter

    def __iter__(self):
        return iter((self.url, self.options))

    @property
    def bucket(self) -> str:
        return self.url[5:].split("/", 1)[0]


def counted_root(request, server) -> CountedRoot:
    """A fresh bucket on ``server`` (an ``S3Server``) behind a counting proxy of this test's own (stopped
    after it). The bucket is made and dropped on the server directly: those requests are not counted."""
    from support.s3_servers import new_bucket

    counter = S3Counter(server.endpoint).start()
    request.addfinalizer(counter.stop)
    url, options = new_bucket(request, server)
    return CountedRoot(url, {**options, "endpoint_url": counter.endpoint}, counter)
