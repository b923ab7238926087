#!/usr/bin/env python3
"""A TLS terminator in front of a plaintext kwc, for bench/run.py --tls-shim
only: it lets the bench's TLS clients (wrk, curl, fanout --tls, slowloris.py)
be exercised before kwc itself speaks TLS. Its numbers measure this Python
relay, not kwc; run.py never saves them.

  tlsshim.py --cert F --key F --upstream-port P --port-file F
"""
import argparse
import asyncio
import os
import ssl


async def pipe(r, w):
    try:
        while True:
            d = await r.read(65536)
            if not d:
                break
            w.write(d)
            await w.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        try:
            w.close()
        except (ConnectionError, ssl.SSLError, RuntimeError):
            pass


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--upstream-port", type=int, required=True)
    ap.add_argument("--port-file", required=True)
    a = ap.parse_args()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)

    async def on_conn(cr, cw):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", a.upstream_port)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw))

    srv = await asyncio.start_server(on_conn, "127.0.0.1", 0, ssl=ctx, backlog=4096)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % srv.sockets[0].getsockname()[1])
    os.rename(tmp, a.port_file)
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
