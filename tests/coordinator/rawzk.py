"""A minimal ZooKeeper client speaking jute directly: for what kazoo cannot send (addWatch,
malformed or oversized frames)."""

import socket
import struct
import time


def jstring(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">i", len(b)) + b


class RawClient:
    def __init__(self, port, timeout_ms=10000, session=None, last_zxid=0):
        """`session` is (id, password) to resume; a new session otherwise. `last_zxid` is the
        newest zxid the client saw, as the Java client sends it: a server behind it catches up
        before it answers (so a resumed session is known there)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.xid = 0
        self.events = []
        self.last_zxid = last_zxid
        session_id, password = session or (0, b"\0" * 16)
        connect = (struct.pack(">iqiq", 0, last_zxid, timeout_ms, session_id) + struct.pack(">i", len(password))
                   + password + b"\0")
        self.send_frame(connect)
        body = self.read_frame()
        _, self.timeout_ms, self.session_id = struct.unpack_from(">iiq", body)
        (plen,) = struct.unpack_from(">i", body, 16)
        self.password = body[20:20 + plen]

    def send_frame(self, payload: bytes):
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def read_frame(self) -> bytes:
        header = self._read_exact(4)
        (length,) = struct.unpack(">i", header)
        return self._read_exact(length)

    def _read_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("server closed the connection")
            out += chunk
        return out

    def _take(self, frame):
        xid, zxid, err = struct.unpack_from(">iqi", frame)
        self.last_zxid = max(self.last_zxid, zxid)
        if xid == -1:
            etype, state = struct.unpack_from(">ii", frame, 16)
            (plen,) = struct.unpack_from(">i", frame, 24)
            self.events.append((etype, frame[28:28 + plen].decode()))
            return None
        return xid, err, frame[16:]

    def request(self, op, body=b""):
        self.xid += 1
        self.send_frame(struct.pack(">ii", self.xid, op) + body)
        while True:
            got = self._take(self.read_frame())
            if got and got[0] == self.xid:
                return got[1], got[2]

    def add_watch(self, path, mode):
        return self.request(106, jstring(path) + struct.pack(">i", mode))[0]

    def collect_events(self, wait=0.5):
        """Reads whatever events arrive within `wait` seconds."""
        self.sock.settimeout(0.05)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                self._take(self.read_frame())
            except socket.timeout:
                pass
        self.sock.settimeout(5)
        return list(self.events)

    def close(self):
        try:
            self.request(-11)
        except (OSError, ConnectionError):
            pass
        self.sock.close()
