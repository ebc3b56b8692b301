"""The storage node's Insert call made by hand, so that a test can send what no well-behaved
writer would: hand-encoded protobuf over grpcio's generic calls, Arrow IPC from pyarrow."""

import io

import grpc
import pyarrow as pa

INSERT = "/mergestream.ingest.v1.Ingest/Insert"
QUERY = "/mergestream.ingest.v1.Ingest/Query"


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32/int64 as protobuf writes them: ten bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, value) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint((number << 3) | 2) + _varint(len(data)) + data


def insert_request(table: str, ipc: bytes, token: str = "", offset=None) -> bytes:
    """`offset` is (path, expected_version, next_position)."""
    body = _field(1, table) + _field(2, ipc)
    if token:
        body += _field(3, token)
    if offset is not None:
        path, version, position = offset
        body += _field(4, _field(1, path) + _field(2, version) + _field(3, position))
    return body


def ipc_stream(batch: pa.RecordBatch) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


class Client:
    def __init__(self, addr: str):
        self.channel = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 256 << 20)])
        self._insert = self.channel.unary_unary(INSERT, request_serializer=None, response_deserializer=None)
        self._query = self.channel.unary_unary(QUERY, request_serializer=None, response_deserializer=None)

    def insert(self, table, ipc, token="", offset=None, timeout=60):
        """(status code, details, metadata dict): OK with the raw reply bytes as details."""
        try:
            reply = self._insert(insert_request(table, ipc, token, offset), timeout=timeout)
            return grpc.StatusCode.OK, reply, {}
        except grpc.RpcError as e:
            return e.code(), e.details(), dict(e.trailing_metadata() or ())

    def query(self, sql, timeout=60):
        """(status code, details): OK with the raw reply bytes as details."""
        try:
            return grpc.StatusCode.OK, self._query(_field(1, sql) + _field(2, "TSV"), timeout=timeout)
        except grpc.RpcError as e:
            return e.code(), e.details()

    def close(self):
        self.channel.close()
