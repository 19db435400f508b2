#!/usr/bin/env python3
"""Serves a folder over HTTP for the remote-shard tests and benchmarks: nginx on 127.0.0.1 at
an ephemeral port and, in front of it, a proxy that injects faults chosen by the URL's first
path segment; nginx also serves the folder over HTTPS with the test certificate
(data/tls/cert.pem), and so does the proxy. Prints "PORTS <nginx> <proxy> - - <nginx https>
<proxy https>" once all four accept connections (the dashes: s3_serve.py's access key there),
or "SKIP <reason>" when nginx is not installed, and runs until its standard input closes.

usage: serve.py ROOT

The proxy serves http://127.0.0.1:<proxy>/<mode>/<path> as nginx serves /<path>, where <mode>
is a comma-separated list of tokens (unknown tokens are ignored, so one can be a nonce that
gives a test case counts of its own). Faults count the requests made for each whole target
(mode and path): "reset2" applies to the first 2 requests of each target, and so on. They apply
to .tar paths only, unless the token "all" is given, and with "on<text>" only to paths holding
<text>.
  lat<ms>       waits <ms> before answering each request (an added round trip)
  bw<KiB/s>     sends bodies at most this fast, each connection (in pieces of a 20th of a
                second's worth, at least 1 KiB)
  link<KiB/s>   sends the bodies of all the mode's connections together at most this fast
  reset<k>      sends half the body, then resets the connection (RST)
  503x<k>       answers 503
  short<k>      sends half the body with the true Content-Length, then closes
  lie<k>        says Content-Length is half the body, sends that half and closes
  lielong<k>    says Content-Length is 1000 bytes more than the body, sends the body and closes
  always503     answers 503 to every request
  from<k>       no fault for the first k requests of each target (a later epoch's fail)
  whole         faults apply only to GETs from byte 0 (no Range, or one from 0: a whole
                shard's, not a sample's), and count only those
  403           answers 403
  expired       answers 403 with S3's <Error> body for a presigned URL past its expiry
                (Code AccessDenied, Message "Request has expired")
  longdenied    answers 403 AccessDenied, its Message a Latin-1 byte and then 400 two-byte
                UTF-8 characters
  wrongregion   answers 400 with S3's <Error> body AuthorizationHeaderMalformed (the request
                signed for another region), its quotes escaped as MinIO's Go writes them
  s3timeout<k>  answers 400 with S3's <Error> body RequestTimeout (S3 gave up waiting on the
                request: to be retried)
  bigbody       503s (503x, always503) carry a 20 KiB S3 <Error> body (Code SlowDown)
  moved         answers 301 with a body and no Location (a redirect with nowhere to go)
  loop          answers 302 with Location: the same target (a redirect to itself, forever)
  norange       forwards requests without their Range header: nginx answers each with its
                whole body (200), as a server that ignores ranges does
  onerange      forwards a request for several ranges as one for the range that covers them
                (one 206 with one Content-Range), as a server that merges them may answer
  changed<k>    after the first k requests of a target, answers carry another ETag, as if the
                object had been replaced: a request with If-Range goes to nginx without its
                Range and If-Range, so the whole body comes (200), as from a server whose
                object no longer matches the If-Range
  noifrange     forwards requests without their If-Range header (a server that ignores it)
  nototal       a 206's Content-Range says "bytes FIRST-LAST/*" (the whole size unknown)
  shortpart     a multipart/byteranges answer's first part is 10 bytes shorter than its
                Content-Range says (the Content-Length stays true)
  shortlast     its last part is 100 bytes shorter, cut a quarter into its data
  cap<k>        a request for one range is forwarded as one for at most its first k bytes
                (nginx's 206 then ends there, where its Content-Range says), as a server that
                caps the bytes it answers at once; several ranges and whole GETs pass as asked
  cutat<k>      a body (whole, or one range: not a multipart one) that reaches past byte k of
                the file stops there (the bytes before it sent with the true Content-Length,
                then the connection closed): every try of it fails at that byte, resumed ones
                (Range from k on) with no byte at all
http://127.0.0.1:<proxy>/count/<mode> answers the number of requests made under /<mode>/ so far,
/ifrange/<mode> the number of them that carried an If-Range header, and /connections/<mode> the
number of client connections that carried one of them: a response
without a fault keeps its connection open for the client's next request (HTTP/1.1 keep-alive),
as nginx does, and the proxy's own connection to nginx is kept with it.
"""
import asyncio
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time


def s3_error(code, message):
    """An S3 error answer's body, as S3 writes it (the message's '&' escaped as XML wants)."""
    message = message.replace("&", "&amp;").replace("<", "&lt;")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>4442587FB7D0A2F9</RequestId></Error>"
            ).encode()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_nginx(root, tmp):
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        print("SKIP nginx is not installed (Debian's nginx-light; tools/deps.sh installs it)",
              flush=True)
        sys.exit(0)
    # HTTPS beside HTTP: the test certificate (tests/shards/data/tls, self-signed for
    # 127.0.0.1, valid to 2126) is its own CA, which a client trusts through CURL_CA_BUNDLE.
    tls_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tls")
    for _ in range(20):  # another process may take the port between free_port and listen
        port, tls_port = free_port(), free_port()
        if port == tls_port:
            continue
        conf = os.path.join(tmp, "nginx.conf")
        # COLOAD_SERVE_FILE_CACHE=1 (the benchmarks): nginx keeps files open between requests,
        # as a server of shards is set up. The tests leave it off: they rewrite files under it.
        file_cache = ("\n  open_file_cache max=10000 inactive=60s; open_file_cache_valid 60s;"
                      if os.environ.get("COLOAD_SERVE_FILE_CACHE") == "1" else "")
        # tcp_nopush stays off (nginx's default): with it on, about one multi-range GET in ten
        # stalled 40-50 ms mid-body on loopback (sendfile corked), which the benchmarks'
        # rows then measured as the loader's waits.
        with open(conf, "w") as f:
            f.write(f"""daemon off; master_process off; worker_processes 1;
error_log {tmp}/error.log; pid {tmp}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off; sendfile on; tcp_nopush off; keepalive_requests 100000;{file_cache}
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  default_type application/octet-stream;
  server {{ listen 127.0.0.1:{port}; root {root}; }}
  server {{ listen 127.0.0.1:{tls_port} ssl; root {root};
    ssl_certificate {tls_dir}/cert.pem; ssl_certificate_key {tls_dir}/key.pem; }}
}}
""")
        proc = subprocess.Popen([nginx, "-e", f"{tmp}/error.log", "-p", tmp, "-c", conf],
                                stdin=subprocess.DEVNULL)
        # nginx tells no one it is ready: its port accepting a connection is the sign.
        while proc.poll() is None:
            try:
                for p in (port, tls_port):
                    socket.create_connection(("127.0.0.1", p), timeout=1).close()
                return proc, port, tls_port
            except OSError:
                time.sleep(0.02)
    sys.exit("serve.py: nginx did not start; see " + tmp + "/error.log")


class Proxy:
    def __init__(self, upstream):
        self.upstream = upstream
        self.seen = {}
        self.seen_whole = {}  # the "whole" token's count, per target
        self.if_range = {}  # target: requests for it that carried If-Range
        self.connections = {}  # mode: the client connections that served a request under it
        self.opened = 0
        self.link_free = {}  # mode: when its link is free to send the next byte (loop time)

    async def handle(self, cr, cw):
        self.opened += 1
        conn = self.opened
        up = [None, None]  # this client connection's nginx connection, kept between requests
        try:
            # One request after another on the connection (HTTP/1.1 keep-alive), until a fault
            # closes it or the client does.
            while await self.serve(cr, cw, conn, up):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            # A reset client, a client that closed between requests, or the server closing
            # with the request in flight.
            pass
        finally:
            if up[1] is not None:
                up[1].close()
            cw.close()

    async def serve(self, cr, cw, conn, up):
        """Answers one request; whether the connection goes on to the next."""
        head = (await cr.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, _ = head[0].split(" ", 2)
        for prefix, table in (("/count/", self.seen), ("/ifrange/", self.if_range),
                              ("/connections/", self.connections)):
            if target.startswith(prefix):
                # /count/<mode>: requests so far whose target starts "/<mode>/"; /ifrange/<mode>:
                # those with If-Range; /connections/<mode>: client connections that carried one.
                mode = "/" + target[len(prefix):].strip("/") + "/"
                if table is not self.connections:
                    n = sum(n for t, n in table.items() if t.startswith(mode))
                else:
                    n = len(table.get(mode, ()))
                body = str(n).encode()
                cw.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (len(body), body))
                await cw.drain()
                return False
        m = re.match(r"/([^/]*)(/.*)", target)
        mode, path = (m.group(1), m.group(2)) if m else ("", target)
        self.connections.setdefault("/" + mode + "/", set()).add(conn)
        n = self.seen[target] = self.seen.get(target, 0) + 1
        tokens = mode.split(",")
        opts = {}
        for t in tokens:
            k = re.fullmatch(r"(lat|bw|link|reset|503x|short|lie|lielong|from|changed|s3timeout|cutat|cap)(\d+)", t)
            if k:
                opts[k.group(1)] = int(k.group(2))
        faulty = path.endswith(".tar") or "all" in tokens
        if "whole" in tokens:
            # Only GETs from byte 0 (a whole shard's, not a sample's), counted apart.
            ranges = [l for l in head[1:] if l.lower().startswith("range:")]
            if ranges and not re.fullmatch(r"(?i)range:\s*bytes=0-\d*\s*", ranges[0]):
                faulty = False
            else:
                n = self.seen_whole[target] = self.seen_whole.get(target, 0) + 1
        only = [t[2:] for t in tokens if t.startswith("on")]
        if only and not any(o in path for o in only):
            faulty = False
        if n <= opts.get("from", 0):
            faulty = False
        hit = lambda name: faulty and n <= opts.get(name, 0)
        client_close = any(l.lower().replace(" ", "") == "connection:close" for l in head[1:])
        if "lat" in opts:
            await asyncio.sleep(opts["lat"] / 1000)
        if faulty and ("403" in tokens or "always503" in tokens or hit("503x")):
            code = "403 Forbidden" if "403" in tokens else "503 Service Unavailable"
            body = b""
            if code.startswith("503") and "bigbody" in tokens:
                body = s3_error("SlowDown", "Please reduce your request rate. " + "x" * 20000)
            cw.write(f"HTTP/1.1 {code}\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + body)
            await cw.drain()
            return False
        if faulty and ("expired" in tokens or "wrongregion" in tokens or "longdenied" in tokens
                       or hit("s3timeout")):
            if "longdenied" in tokens:
                # A Latin-1 byte, then two-byte characters across the message's 300-byte bound.
                code, body = "403 Forbidden", s3_error(
                    "AccessDenied", "User: caf\xe9 ").replace(b"\xc3\xa9", b"\xe9")
                body = body.replace(b"</Message>", ("\u00e9" * 400).encode() + b"</Message>")
            elif "expired" in tokens:
                code, body = "403 Forbidden", s3_error("AccessDenied", "Request has expired")
            elif "wrongregion" in tokens:
                code, body = "400 Bad Request", s3_error(
                    "AuthorizationHeaderMalformed", "The authorization header is malformed; the "
                    "region 'us-east-1' is wrong; expecting 'eu-west-1'").replace(b"'", b"&#39;")
            else:
                code, body = "400 Bad Request", s3_error(
                    "RequestTimeout", "Your socket connection to the server was not read from "
                    "or written to within the timeout period.")
            cw.write(f"HTTP/1.1 {code}\r\nContent-Type: application/xml\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await cw.drain()
            return True
        if faulty and "loop" in tokens:
            cw.write(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n"
                     % target.encode())
            await cw.drain()
            return True
        if faulty and "moved" in tokens:
            body = b"moved elsewhere, the new place not said\n"
            cw.write(b"HTTP/1.1 301 Moved Permanently\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))
            await cw.drain()
            return False
        if up[1] is None:
            up[0], up[1] = await asyncio.open_connection("127.0.0.1", self.upstream)
        ur, uw = up
        if_range = any(l.lower().startswith("if-range:") for l in head[1:])
        if if_range:
            self.if_range[target] = self.if_range.get(target, 0) + 1
        changed = faulty and "changed" in opts and n > opts["changed"]
        drop = ("connection:", "keep-alive:") + (("range:",) if "norange" in tokens else ())
        if "noifrange" in tokens:
            drop += ("if-range:",)
        elif changed and if_range:
            drop += ("range:", "if-range:")  # the object no longer matches: all of it comes
        keep = [l for l in head[1:] if l and not l.lower().startswith(drop)]
        if "onerange" in tokens:
            # Several ranges asked as the one that covers them all, as some servers answer.
            for k, l in enumerate(keep):
                m = re.fullmatch(r"(?i)range:\s*bytes=(.*)", l)
                if m and "," in m.group(1):
                    spans = [tuple(int(x) for x in r.split("-")) for r in m.group(1).split(",")]
                    keep[k] = "Range: bytes=%d-%d" % (min(a for a, _ in spans),
                                                      max(b for _, b in spans))
        if "cap" in opts:
            # One range asked: at most its first `cap` bytes.
            for k, l in enumerate(keep):
                m = re.fullmatch(r"(?i)range:\s*bytes=(\d+)-(\d*)\s*", l)
                if m:
                    first = int(m.group(1))
                    last = first + opts["cap"] - 1
                    if m.group(2):
                        last = min(last, int(m.group(2)))
                    keep[k] = "Range: bytes=%d-%d" % (first, last)
        uw.write((f"{method} {path} HTTP/1.1\r\n" + "".join(l + "\r\n" for l in keep) +
                  "\r\n").encode("latin-1"))
        await uw.drain()
        rhead = (await ur.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length = None
        upstream_close = False
        out = [rhead[0]]
        for l in rhead[1:]:
            if not l:
                continue
            low = l.lower().replace(" ", "")
            if low.startswith(("connection:", "keep-alive:")):
                upstream_close = upstream_close or low == "connection:close"
                continue
            if low.startswith("content-length:"):
                length = int(l.split(":", 1)[1])
                continue
            if "nototal" in tokens and low.startswith("content-range:"):
                l = re.sub(r"/\d+$", "/*", l)
            if changed and low.startswith("etag:"):
                l = 'ETag: "replaced-' + l.split(":", 1)[1].strip().strip('"') + '"'
            out.append(l)
        ctype = next((l for l in out if l.lower().startswith("content-type:")), "")
        multipart = re.search(r"multipart/byteranges;\s*boundary=(\S+)", ctype, re.I)
        if ("shortpart" in tokens or "shortlast" in tokens) and multipart and length is not None:
            body = await ur.readexactly(length)
            delim = b"\r\n--" + multipart.group(1).encode("latin-1")
            if "shortpart" in tokens:  # the first part's last 10 bytes
                second = body.find(delim, body.find(delim) + 1)
                if second > 10:
                    body = body[:second - 10] + body[second:]
            else:  # 100 bytes a quarter into the last part's data
                closing = body.rfind(delim)
                data = body.find(b"\r\n\r\n", body.rfind(delim, 0, closing)) + 4
                cut = data + (closing - data) // 4
                if closing - data > 400:
                    body = body[:cut] + body[cut + 100:]
            ur, length = _Bytes(body), len(body)
        if length is None:  # not what nginx sends for a file: read it whole, then close
            upstream_close = True
            body = await ur.read()
            length = len(body)
            ur = _Bytes(body)
        send = length  # body bytes sent
        said = length  # the Content-Length told
        reset = hit("reset")
        cut = None
        if faulty and "cutat" in opts and not multipart:
            first = next((int(m.group(1)) for l in out
                          for m in [re.match(r"(?i)content-range:\s*bytes\s+(\d+)-", l)] if m), 0)
            if first + length > opts["cutat"]:
                cut = max(0, opts["cutat"] - first)
        fault = reset or hit("short") or hit("lie") or hit("lielong") or cut is not None
        if cut is not None:
            send = cut
        elif reset or hit("short"):
            send = length // 2
        elif hit("lie"):
            send = said = length // 2
        elif hit("lielong"):
            said = length + 1000
        # A fault's response closes the connection (as before); any other keeps it for the
        # client's next request, unless the client asked to close.
        close = fault or client_close
        out.append(f"Content-Length: {said}")
        if close:
            out.append("Connection: close")
        cw.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        bw = opts.get("bw", 0) * 1024
        link = opts.get("link", 0) * 1024
        left = send
        # With a per-connection cap, pieces of a 20th of a second's worth (at least 1 KiB):
        # a body shorter than one 64 KiB read would otherwise go out at once, uncapped.
        step = min(64 << 10, max(1 << 10, bw // 20)) if bw else 64 << 10
        while left > 0:
            chunk = await ur.read(min(left, step))
            if not chunk:
                break
            left -= len(chunk)
            cw.write(chunk)
            await cw.drain()
            if bw:
                await asyncio.sleep(len(chunk) / bw)
            if link:
                # The chunk takes its turn on the mode's one link: the sum of all its
                # connections' rates stays under the cap.
                now = asyncio.get_running_loop().time()
                free = max(now, self.link_free.get(mode, 0.0)) + len(chunk) / link
                self.link_free[mode] = free
                await asyncio.sleep(free - now)
        if upstream_close or left > 0 or send < length:
            # nginx's connection is reused only when its whole body was read.
            uw.close()
            up[0] = up[1] = None
        if reset:
            sock = cw.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            cw.transport.abort()
            return False
        if close:
            await cw.drain()
            return False
        return True


class _Bytes:
    """A body already read, read again in pieces."""
    def __init__(self, data):
        self.data = data

    async def read(self, n):
        out, self.data = self.data[:n], self.data[n:]
        return out


async def main(root):
    tmp = tempfile.mkdtemp(prefix="coload-serve-")
    nginx, nginx_port, tls_port = start_nginx(os.path.abspath(root), tmp)
    try:
        proxy = Proxy(nginx_port)
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, backlog=256)
        port = server.sockets[0].getsockname()[1]
        # The proxy over HTTPS too (the same faults, the same counts), with nginx's certificate.
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tls")
        tls.load_cert_chain(os.path.join(tls_dir, "cert.pem"), os.path.join(tls_dir, "key.pem"))
        tls_server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, backlog=256,
                                                ssl=tls)
        tls_proxy = tls_server.sockets[0].getsockname()[1]
        print(f"PORTS {nginx_port} {port} - - {tls_port} {tls_proxy}", flush=True)
        closed = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()

        def on_stdin():
            if not os.read(sys.stdin.fileno(), 4096) and not closed.done():
                closed.set_result(None)

        loop.add_reader(sys.stdin.fileno(), on_stdin)
        await closed
        server.close()
        tls_server.close()
    finally:
        nginx.terminate()
        nginx.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1]))
