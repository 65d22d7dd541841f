"""Small network programs that the host bed's tests run inside hosts.

serve                   listen on a free port (printing "listening PORT"), print every line
                        received ("got LINE")
relay HOST PORT         connect, then send every line of stdin (printing "sent LINE")
sink                    listen like serve; read one connection to its end, print the bytes
                        and seconds
blast HOST PORT BYTES   send BYTES to a sink
reach HOST:PORT...      try to connect to each (2 s), print "ok" or the error for each
"""

import socket
import sys
import threading
import time


def listen() -> socket.socket:
    server = socket.create_server(("0.0.0.0", 0))
    print("listening", server.getsockname()[1], flush=True)
    return server


def serve() -> None:
    server = listen()

    def read(conn: socket.socket) -> None:
        for line in conn.makefile("r"):
            print("got", line.strip(), flush=True)

    while True:
        conn, _ = server.accept()
        threading.Thread(target=read, args=(conn,), daemon=True).start()


def relay(host: str, port: int) -> None:
    conn = socket.create_connection((host, port), timeout=10)
    conn.settimeout(None)
    print("connected", flush=True)
    for line in sys.stdin:
        conn.sendall(line.encode())
        print("sent", line.strip(), flush=True)


def sink() -> None:
    server = listen()
    conn, _ = server.accept()
    began, total = None, 0
    while data := conn.recv(1 << 16):
        began = began or time.perf_counter()
        total += len(data)
    print(total, time.perf_counter() - began, flush=True)


def blast(host: str, port: int, size: int) -> None:
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(b"x" * size)


def reach(targets: list[str]) -> None:
    for target in targets:
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            print(target, "ok", flush=True)
        except OSError as exc:
            print(target, type(exc).__name__, flush=True)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "serve":
        serve()
    elif command == "relay":
        relay(args[0], int(args[1]))
    elif command == "sink":
        sink()
    elif command == "blast":
        blast(args[0], int(args[1]), int(args[2]))
    elif command == "reach":
        reach(args)
