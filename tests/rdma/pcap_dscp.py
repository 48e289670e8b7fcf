#!/usr/bin/env python3
"""The DSCP of every RoCE v2 frame of a capture, by destination and QP.

  pcap_dscp.py CAPTURE.pcap [RANK_LOG ...]

Counts RoCE v2 frames (UDP port 4791) by (destination address, destination
QP number, DSCP). With the logs of ib_transport_check, whose "conn" lines
name each connection's class, its traffic class and its local QP (and those of
the library's ranks, whose ibverbs module logs the same at EP_DEBUG=INFO), it checks
that every frame to a QP carries the DSCP of that QP's class, and that each
class was seen on the wire; exit 1 otherwise. Node N's ranks have address
10.77.0.N (ranks 2N-2 and 2N-1)."""
import re
import struct
import sys
from collections import Counter


def frames(path):
    data = open(path, 'rb').read()
    if len(data) < 24:
        return
    endian = '<' if data[:4] == b'\xd4\xc3\xb2\xa1' else '>'
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack_from(endian + 'IIII', data, off)
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def roce(frame):
    """(dst ip, dest qpn, dscp) of a RoCE v2 frame, else None."""
    if len(frame) < 14 + 20 + 8 + 12 or frame[12:14] != b'\x08\x00' or frame[23] != 17:
        return None
    ihl = (frame[14] & 15) * 4
    udp = 14 + ihl
    if struct.unpack_from('>H', frame, udp + 2)[0] != 4791:
        return None
    bth = udp + 8
    qpn = struct.unpack_from('>I', frame, bth + 4)[0] & 0xffffff
    dst = '.'.join(str(b) for b in frame[30:34])
    return dst, qpn, frame[15] >> 2


def main():
    counts = Counter(r for r in map(roce, frames(sys.argv[1])) if r)
    expect = {}  # (ip, qpn) -> (class, dscp)
    line = re.compile(r'\[rank (\d+)\] conn peer \d+ class (\d): .* TC (\d+) .*QP (\d+),')
    # The library's ranks (EP_DEBUG=INFO): the ibverbs module's connection lines.
    names = {'throughput': 0, 'low latency': 1, 'control': 2}
    lib = re.compile(r'transport ibverbs: rank (\d+): connected to rank \d+ \(([a-z ]+)\) .*'
                     r'\[local QPs ([\d ]+)\], TC (\d+),')
    for log in sys.argv[2:]:
        for text in open(log, errors='replace'):
            m = line.search(text)
            if m:
                rank, cls, tc, qpn = map(int, m.groups())
                expect[('10.77.0.%d' % (rank // 2 + 1), qpn)] = (cls, tc >> 2)
            m = lib.search(text)
            if m:
                rank, tc = int(m.group(1)), int(m.group(4))
                for qpn in m.group(3).split():
                    expect[('10.77.0.%d' % (rank // 2 + 1), int(qpn))] = (names[m.group(2)], tc >> 2)
    bad, seen = 0, Counter()
    for (ip, qpn, dscp), n in sorted(counts.items()):
        want = expect.get((ip, qpn))
        note = ''
        if want:
            seen[want] += n
            note = 'class %d, DSCP %d expected' % want
            if dscp != want[1]:
                bad += n
                note += ': WRONG'
        print('to %s QP %d: DSCP %d, %d frames %s' % (ip, qpn, dscp, n, note))
    if expect:
        classes = sorted(set(expect.values()))
        for c in classes:
            print('class %d (DSCP %d): %d frames' % (c[0], c[1], seen[c]))
        if bad or any(seen[c] == 0 for c in classes):
            print('FAIL: %d frames with a wrong DSCP; classes without frames: %s' %
                  (bad, [c for c in classes if seen[c] == 0]))
            return 1
        print('PASS: every frame carries its class\'s DSCP')
    return 0


if __name__ == '__main__':
    sys.exit(main())
