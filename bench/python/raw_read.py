"""The anchor of the JSON client's figure: one run through the broker over
JSON lines (its output raw after each line, as clients/python asks),
its bytes read from the socket as they come (recv_into one buffer),
nothing decoded, until the last line (`finished`) has arrived.

    python3 raw_read.py --socket SOCKET -- CMD [ARGS...]

Prints the bytes read.
"""
import json
import os
import socket
import sys

path, argv = sys.argv[2], sys.argv[4:]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(path)
hello = {"hello": {"magic": "palisade", "version": 14, "min_version": 12, "encoding": "json"}}
# The wire clients/python reads: output raw after its lines.
run = {"run": {"argv": argv, "cwd": os.getcwd(), "raw_output": True}}
sock.sendall((json.dumps(hello) + "\n" + json.dumps(run) + "\n").encode())
buf = bytearray(1 << 20)
view = memoryview(buf)
total = 0
while True:
    n = sock.recv_into(buf)
    if n == 0:
        break
    total += n
    # Only the end of a read is looked at: the result is the last line.
    if view[max(0, n - 65536):n].tobytes().find(b'{"finished"') >= 0:
        break
print(total)
