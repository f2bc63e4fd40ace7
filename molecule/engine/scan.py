"""A TCP connect scan of a lab host's listening ports, run from another lab host:

    python3 scan.py HOST PORT [PORT ...]

Each port is tried at once (threads), with a 3 s timeout: "open" (connected), "closed" (the
host answered with a reset: nothing listens, or a reject) or "filtered" (no answer: the
firewall dropped it). Prints one JSON object {port: state}.
"""

import json
import socket
import sys
import threading

host, ports = sys.argv[1], sorted({int(p) for p in sys.argv[2:]})
result = {}


def probe(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect((host, port))
        result[port] = "open"
    except ConnectionRefusedError:
        result[port] = "closed"
    except TimeoutError:
        result[port] = "filtered"
    except OSError as exc:
        result[port] = "error: %s" % exc
    finally:
        sock.close()


threads = [threading.Thread(target=probe, args=(p,)) for p in ports]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({str(p): result[p] for p in ports}))
