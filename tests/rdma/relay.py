#!/usr/bin/env python3
"""The link between the two test VMs, relayed so that it can fail.

    relay.py JOB

Each VM sends its frames to JOB/relay.N.sock (a unix datagram socket this
relay binds) instead of to the other VM; the relay forwards them to the other
VM's JOB/net.M.sock, except during an outage, when it drops every frame both
ways. A VM asks for an outage by writing, in the shared job folder, the file
JOB/outage with its length in milliseconds and a name: the relay takes the file away,
drops frames from then for that long, and logs the drop's start and end and
the frames dropped in JOB/relay.log. Stops when JOB/relay.stop appears.
"""
import os
import select
import socket
import sys
import time


def main():
    job = sys.argv[1]
    socks = {}
    for n in (1, 2):
        path = os.path.join(job, "relay.%d.sock" % n)
        if os.path.exists(path):
            os.unlink(path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        os.chmod(path, 0o777)
        socks[n] = s
    log = open(os.path.join(job, "relay.log"), "a", buffering=1)
    control = os.path.join(job, "outage")
    stop = os.path.join(job, "relay.stop")
    drop_until = 0.0
    dropped = forwarded = 0
    in_outage = False
    next_look = 0.0
    while True:
        now = time.monotonic()
        if now >= next_look:  # the control files, 20 times a second
            next_look = now + 0.05
            if os.path.exists(stop):
                break
            if os.path.exists(control):
                try:
                    with open(control) as f:
                        words = f.read().split()
                    os.unlink(control)
                    ms, name = int(words[0]), (words[1] if len(words) > 1 else "-")
                except (OSError, ValueError, IndexError):
                    ms, name = 0, "-"
                if ms > 0:
                    drop_until = now + ms / 1000.0
                    in_outage = True
                    dropped = 0
                    log.write("outage %s of %d ms from %.3f\n" % (name, ms, time.time()))
        if in_outage and now >= drop_until:
            in_outage = False
            log.write("outage over at %.3f: %d frames dropped\n" % (time.time(), dropped))
        ready, _, _ = select.select(list(socks.values()), [], [], 0.05)
        for s in ready:
            frame = s.recv(65536)
            src = 1 if s is socks[1] else 2
            if in_outage:
                dropped += 1
                continue
            try:  # from the socket the other VM has as its peer: it takes frames from that one only
                socks[3 - src].sendto(frame, os.path.join(job, "net.%d.sock" % (3 - src)))
                forwarded += 1
            except OSError:
                pass  # the other VM is not up yet, or gone: frames are lost, as on a wire
    log.write("relay stops: %d frames forwarded\n" % forwarded)


if __name__ == "__main__":
    main()
