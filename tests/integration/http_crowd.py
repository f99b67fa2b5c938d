#!/usr/bin/env python3
"""A crowd on ballastd's HTTP port, for tests/integration/test_chaos_http.py:
idle connections that send nothing, slow ones that send a request head one
byte every 4 s, and event streams that are read and never end, each slot
reconnecting whenever ballastd closes it. Connection i comes from
127.0.0.(2 + i / --per-address). Runs until SIGTERM and prints, twice a
second, a JSON line of how many connections of each kind are open, how many
were reopened and how many were refused."""
import argparse
import asyncio
import collections
import json
import signal
import sys


class Crowd:
    def __init__(self, args):
        self.args = args
        self.open = collections.Counter()
        self.reconnects = collections.Counter()
        self.refused = collections.Counter()

    def source(self, i):
        return f"127.0.0.{2 + i // self.args.per_address}"

    async def run(self):
        a = self.args
        slots = [self.slot("idle", i, self.idle) for i in range(a.idle)]
        slots += [self.slot("slow", a.idle + i, self.slow) for i in range(a.slow)]
        slots += [self.slot("stream", a.idle + a.slow + i, self.stream(*s.split(":", 1)))
                  for i, s in enumerate(a.streams)]
        tasks = [asyncio.ensure_future(s) for s in slots]
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        while not stop.is_set():
            self.report()
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.report()

    def report(self):
        print(json.dumps({"open": dict(self.open), "reconnects": dict(self.reconnects),
                          "refused": dict(self.refused)}), flush=True)

    async def slot(self, kind, i, behave):
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.args.port, local_addr=(self.source(i), 0))
            except OSError:
                self.refused[kind] += 1
                await asyncio.sleep(0.5)
                continue
            try:
                await behave(reader, writer)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
            self.reconnects[kind] += 1

    async def idle(self, reader, writer):
        self.open["idle"] += 1
        try:
            while await reader.read(4096):
                pass
        finally:
            self.open["idle"] -= 1

    async def slow(self, reader, writer):
        head = b"GET /healthz HTTP/1.1\r\nHost: ballastd\r\nX-Slow: " + b"x" * 4096
        self.open["slow"] += 1
        try:
            for byte in head:
                writer.write(bytes([byte]))
                try:
                    # Anything (EOF, or an answer before the head ended) ends the slot.
                    await asyncio.wait_for(reader.read(4096), timeout=4)
                    return
                except asyncio.TimeoutError:
                    pass
        finally:
            self.open["slow"] -= 1

    def stream(self, token, job_id):
        async def follow(reader, writer):
            writer.write(f"GET /api/v1/jobs/{job_id}/stream HTTP/1.1\r\nHost: ballastd\r\n"
                         f"Authorization: Bearer {token}\r\n\r\n".encode())
            status = await reader.readline()
            if b" 200 " not in status:
                self.refused[f"stream {status[9:12].decode(errors='replace')}"] += 1
                await asyncio.sleep(1)
                return
            self.open["stream"] += 1
            try:
                while True:
                    data = await reader.read(4096)
                    # The stream's life ended (its last chunk): an EventSource reconnects.
                    if not data or data.endswith(b"0\r\n\r\n"):
                        return
            finally:
                self.open["stream"] -= 1
        return follow


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument("--slow", type=int, default=0)
    parser.add_argument("--per-address", type=int, default=200)
    parser.add_argument("streams", nargs="*", help="TOKEN:JOB_ID, one per stream")
    asyncio.run(Crowd(parser.parse_args()).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
