#!/usr/bin/env python3
"""A TCP relay that re-cuts the byte stream of MPA (iWARP) connections.

    resegment.py LISTEN_PORT TARGET_PORT [--seed N] [--max-chunk BYTES]

Listens on 127.0.0.1:LISTEN_PORT; every connection accepted is relayed to
127.0.0.1:TARGET_PORT with the bytes unchanged but cut differently, with
TCP_NODELAY on both sides:

- towards the target, in chunks of random size (1 to --max-chunk bytes,
  a quarter of them 1-8 bytes) with a pause of up to 50 us after each, so
  that the target reads segment boundaries anywhere;
- towards the host, frame by frame: the MPA reply, then each FPDU
  (RFC 5044: 2-byte ULPDU length, ULPDU, pad to 4 bytes, 4-byte CRC) is
  written in two parts cut inside its trailer (pad + CRC), with a pause of
  --trailer-pause ms between them, so that the host's TCP hands its iWARP
  receiver the trailer in two pieces. Stock Linux 6.1 siw mis-reads such
  a trailer (siw_get_trailer); see siw-split-trailer.patch.

It prints "ready" on stdout once listening, and one line per connection
closed (bytes each way, FPDUs whose trailer was split). It runs until
killed. Needs nothing beyond the Python standard library.
"""

import argparse
import random
import socket
import sys
import threading
import time


def chunk_sizes(rng, max_chunk):
    """Random chunk sizes: a quarter of them 1-8 bytes, the rest up to max_chunk."""
    while True:
        if rng.random() < 0.25:
            yield rng.randint(1, 8)
        else:
            yield rng.randint(1, max_chunk)


def shut(src, dst):
    """Passes the end of one direction on: no more to send to dst, none to read from src."""
    for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
        try:
            s.shutdown(how)
        except OSError:
            pass


def pump(src, dst, rng, max_chunk, counter, key):
    sizes = chunk_sizes(rng, max_chunk)
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            counter[key] += len(data)
            view = memoryview(data)
            while view:
                n = next(sizes)
                dst.sendall(view[:n])
                view = view[n:]
                time.sleep(rng.uniform(0, 50e-6))
    except OSError:
        pass
    finally:
        shut(src, dst)


MPA_REPLY_HEADER = 20  # 16-byte key, flags, revision, private data length


def recv_exact(sock, n, pending):
    """Returns n bytes, taking first from pending (a bytearray), then the socket."""
    while len(pending) < n:
        data = sock.recv(1 << 16)
        if not data:
            return None
        pending += data
    out = bytes(pending[:n])
    del pending[:n]
    return out


def pump_frames(src, dst, pause, counter):
    """Towards the host: the MPA reply whole, then every FPDU cut inside its trailer."""
    pending = bytearray()
    try:
        head = recv_exact(src, MPA_REPLY_HEADER, pending)
        if head is None:
            return
        reply = recv_exact(src, int.from_bytes(head[18:20], "big"), pending)
        if reply is None:
            return
        dst.sendall(head + reply)
        counter["down"] += len(head) + len(reply)
        while True:
            length = recv_exact(src, 2, pending)
            if length is None:
                break
            ulpdu = int.from_bytes(length, "big")
            pad = -(2 + ulpdu) % 4
            body = recv_exact(src, ulpdu + pad + 4, pending)
            if body is None:
                break
            cut = 2 + ulpdu + 1 + (counter["split"] % (pad + 3))
            fpdu = length + body
            dst.sendall(fpdu[:cut])
            time.sleep(pause)
            dst.sendall(fpdu[cut:])
            counter["down"] += len(fpdu)
            counter["split"] += 1
    except OSError:
        pass
    finally:
        shut(src, dst)


def relay(client, target_port, rng, max_chunk, pause):
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port))
    except OSError as e:
        print(f"connect to {target_port}: {e}", flush=True)
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    counter = {"up": 0, "down": 0, "split": 0}
    threads = [
        threading.Thread(target=pump, args=(client, upstream, random.Random(rng.randrange(1 << 32)), max_chunk, counter, "up")),
        threading.Thread(target=pump_frames, args=(upstream, client, pause, counter)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    upstream.close()
    print(f"connection closed: {counter['up']} bytes to the target, {counter['down']} from it, "
          f"{counter['split']} FPDU trailers split", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("listen_port", type=int)
    ap.add_argument("target_port", type=int)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--max-chunk", type=int, default=2048)
    ap.add_argument("--trailer-pause", type=float, default=1.0, help="ms between the two parts of an FPDU")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", args.listen_port))
    srv.listen(64)
    print(f"ready (seed {seed})", flush=True)
    while True:
        client, _ = srv.accept()
        threading.Thread(target=relay, args=(client, args.target_port, random.Random(rng.randrange(1 << 32)), args.max_chunk,
                                                    args.trailer_pause / 1000), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
