"""A TCP relay that holds every byte for a fixed time in each direction: WAN latency where the kernel has no netem.

Each accepted connection opens one to ``--to``; every chunk read from either
side is written to the other ``--delay-ms`` after it arrived, in order, so a
round trip through the relay gains twice that. The relay adds no rate limit
and changes no byte, so TLS end to end still verifies the peer (gossip checks a
DNS name, not the address dialled). TCP itself sees no delay: the handshake and
ACKs of each leg are local, so slow start and window limits at that RTT are not
reproduced (netem would delay them too).

    python benchmarks/delay_relay.py --listen HOST:PORT --to HOST:PORT --delay-ms 25
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

CHUNK = 1 << 16


def split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


async def delayed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay_s`` after it was read; end of stream half-closes."""
    loop = asyncio.get_running_loop()
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def hold() -> None:
        while data := await reader.read(CHUNK):
            held.put_nowait((loop.time() + delay_s, data))
        held.put_nowait((loop.time() + delay_s, b""))

    async def release() -> None:
        while True:
            due, data = await held.get()
            while (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    async with asyncio.TaskGroup() as group:  # a failed side cancels the other
        group.create_task(hold())
        group.create_task(release())


async def relay(
    to: tuple[str, int], delay_s: float, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
) -> None:
    try:
        server_r, server_w = await asyncio.open_connection(*to)
    except OSError:
        client_w.close()
        return
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(delayed(client_r, server_w, delay_s))
            group.create_task(delayed(server_r, client_w, delay_s))
    except* OSError:  # either side went away (ConnectionError is an OSError): drop both, as a cut link would
        pass
    finally:
        for w in (client_w, server_w):
            w.close()
            with contextlib.suppress(ConnectionError, OSError):
                await w.wait_closed()


async def start(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> asyncio.Server:
    """A listening relay from ``listen`` to ``to``; ``listen``'s port 0 picks a free one."""
    return await asyncio.start_server(lambda r, w: relay(to, delay_s, r, w), *listen)


async def serve(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> None:
    server = await start(listen, to, delay_s)
    print("READY", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="host:port to accept on")
    parser.add_argument("--to", required=True, help="host:port to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="hold time of each direction")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(split(args.listen), split(args.to), args.delay_ms / 1000))


if __name__ == "__main__":
    main()
