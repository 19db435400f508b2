#!/usr/bin/env python3
"""Serves a folder over HTTP for the remote-shard tests and benchmarks: nginx on 127.0.0.1 at
an ephemeral port and, in front of it, a proxy that injects faults chosen by the URL's first
path segment. Prints "PORTS <nginx> <proxy>" once both accept connections, or "SKIP <reason>"
when nginx is not installed, and runs until its standard input closes.

usage: serve.py ROOT

The proxy serves http://127.0.0.1:<proxy>/<mode>/<path> as nginx serves /<path>, where <mode>
is a comma-separated list of tokens (unknown tokens are ignored, so one can be a nonce that
gives a test case counts of its own). Faults count the requests made for each whole target
(mode and path): "reset2" applies to the first 2 requests of each target, and so on. They apply
to .tar paths only, unless the token "all" is given, and with "on<text>" only to paths holding
<text>.
  lat<ms>       waits <ms> before answering each request (an added round trip)
  bw<KiB/s>     sends bodies at most this fast
  reset<k>      sends half the body, then resets the connection (RST)
  503x<k>       answers 503
  short<k>      sends half the body with the true Content-Length, then closes
  lie<k>        says Content-Length is half the body, sends that half and closes
  lielong<k>    says Content-Length is 1000 bytes more than the body, sends the body and closes
  always503     answers 503 to every request
  from<k>       no fault for the first k requests of each target (a later epoch's fail)
  403           answers 403
http://127.0.0.1:<proxy>/count/<mode> answers the number of requests made under /<mode>/ so far.
"""
import asyncio
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time


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
    for _ in range(20):  # another process may take the port between free_port and listen
        port = free_port()
        conf = os.path.join(tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""daemon off; master_process off; worker_processes 1;
error_log {tmp}/error.log; pid {tmp}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  default_type application/octet-stream;
  server {{ listen 127.0.0.1:{port}; root {root}; }}
}}
""")
        proc = subprocess.Popen([nginx, "-e", f"{tmp}/error.log", "-p", tmp, "-c", conf],
                                stdin=subprocess.DEVNULL)
        # nginx tells no one it is ready: its port accepting a connection is the sign.
        while proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return proc, port
            except OSError:
                time.sleep(0.02)
    sys.exit("serve.py: nginx did not start; see " + tmp + "/error.log")


class Proxy:
    def __init__(self, upstream):
        self.upstream = upstream
        self.seen = {}

    async def handle(self, cr, cw):
        try:
            await self.serve(cr, cw)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            # A reset client, or the server closing with the request in flight.
            pass
        finally:
            cw.close()

    async def serve(self, cr, cw):
        head = (await cr.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, _ = head[0].split(" ", 2)
        if target.startswith("/count/"):  # requests so far whose target starts "/<mode>/"
            prefix = "/" + target[len("/count/"):].strip("/") + "/"
            body = str(sum(n for t, n in self.seen.items() if t.startswith(prefix))).encode()
            cw.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (len(body), body))
            await cw.drain()
            return
        m = re.match(r"/([^/]*)(/.*)", target)
        mode, path = (m.group(1), m.group(2)) if m else ("", target)
        n = self.seen[target] = self.seen.get(target, 0) + 1
        tokens = mode.split(",")
        opts = {}
        for t in tokens:
            k = re.fullmatch(r"(lat|bw|reset|503x|short|lie|lielong|from)(\d+)", t)
            if k:
                opts[k.group(1)] = int(k.group(2))
        faulty = path.endswith(".tar") or "all" in tokens
        only = [t[2:] for t in tokens if t.startswith("on")]
        if only and not any(o in path for o in only):
            faulty = False
        if n <= opts.get("from", 0):
            faulty = False
        hit = lambda name: faulty and n <= opts.get(name, 0)
        if "lat" in opts:
            await asyncio.sleep(opts["lat"] / 1000)
        if faulty and ("403" in tokens or "always503" in tokens or hit("503x")):
            code = "403 Forbidden" if "403" in tokens else "503 Service Unavailable"
            cw.write(f"HTTP/1.1 {code}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
            await cw.drain()
            return
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream)
        keep = [l for l in head[1:] if l and not l.lower().startswith(("connection:", "keep-alive:"))]
        uw.write((f"{method} {path} HTTP/1.1\r\n" + "".join(l + "\r\n" for l in keep) +
                  "Connection: close\r\n\r\n").encode("latin-1"))
        await uw.drain()
        rhead = (await ur.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        length = 0
        out = [rhead[0]]
        for l in rhead[1:]:
            if not l or l.lower().startswith(("connection:", "keep-alive:")):
                continue
            if l.lower().startswith("content-length:"):
                length = int(l.split(":", 1)[1])
                continue
            out.append(l)
        send = length  # body bytes sent
        said = length  # the Content-Length told
        reset = hit("reset")
        if reset or hit("short"):
            send = length // 2
        elif hit("lie"):
            send = said = length // 2
        elif hit("lielong"):
            said = length + 1000
        out.append(f"Content-Length: {said}")
        out.append("Connection: close")
        cw.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        bw = opts.get("bw", 0) * 1024
        left = send
        while left > 0:
            chunk = await ur.read(min(left, 64 << 10))
            if not chunk:
                break
            left -= len(chunk)
            cw.write(chunk)
            await cw.drain()
            if bw:
                await asyncio.sleep(len(chunk) / bw)
        uw.close()
        if reset:
            sock = cw.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            cw.transport.abort()


async def main(root):
    tmp = tempfile.mkdtemp(prefix="coload-serve-")
    nginx, nginx_port = start_nginx(os.path.abspath(root), tmp)
    try:
        proxy = Proxy(nginx_port)
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0, backlog=256)
        port = server.sockets[0].getsockname()[1]
        print(f"PORTS {nginx_port} {port}", flush=True)
        closed = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()

        def on_stdin():
            if not os.read(sys.stdin.fileno(), 4096) and not closed.done():
                closed.set_result(None)

        loop.add_reader(sys.stdin.fileno(), on_stdin)
        await closed
        server.close()
    finally:
        nginx.terminate()
        nginx.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1]))
