"""A TCP relay from the sim's bridge to a loopback server: how pods on the real nodes reach the API server.

The API server listens on 127.0.0.1 (sim/controlplane.py), which a pod's network namespace has to itself; a pod's
in-cluster client (KubeRay's operator, sim/kuberay.py) is given this relay's address on the bridge instead. Bytes
pass as they came, TLS included: the API server still authenticates the pod's service account token.
"""

from __future__ import annotations

import argparse
import asyncio

CHUNK = 1 << 16


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def _relay(host: str, port: int, target: tuple[str, int]) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, target_writer), _pipe(target_reader, writer))
        writer.close()
        target_writer.close()

    server = await asyncio.start_server(connection, host, port)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=_address, required=True, help="host:port on the sim's bridge")
    parser.add_argument("--to", type=_address, required=True, help="host:port of the loopback server")
    args = parser.parse_args()
    asyncio.run(_relay(*args.listen, args.to))


if __name__ == "__main__":
    main()
