#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Holds up to N idle TCP connections (never a byte sent: half-open handshakes) against every
# port in PORTS_FILE's listening set, reopening the ones the listener drops, until STOP_FILE
# exists or DEADLINE_S passes. Loopback ports only; prints how many connects it made.
# usage: wan_flood.py PORTS_FILE STOP_FILE N DEADLINE_S
import os
import socket
import sys
import time


def main() -> int:
    ports_file, stop_file, n, deadline_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    ports = [int(p) for p in open(ports_file).read().split()]
    if not ports:
        print("wan_flood: no ports to flood", file=sys.stderr)
        return 1
    socks = []
    made = 0
    refused = 0
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not os.path.exists(stop_file):
        # Drop the connections the listener closed (readable with EOF or reset).
        alive = []
        for s in socks:
            try:
                if s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            alive.append(s)
        socks = alive
        while len(socks) < n:
            port = ports[made % len(ports)]
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            except OSError:
                refused += 1
                s.close()
                break
            socks.append(s)
            made += 1
        time.sleep(0.05)
    for s in socks:
        s.close()
    print(f"wan_flood: {made} connections made, {refused} refused, {n} held at a time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
