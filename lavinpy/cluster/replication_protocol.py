"""The replication wire format: frames, authentication, full-sync messages and stream operations.

Pure functions and a sans-IO frame decoder; the leader (replication_server) and the follower
(replication_client) do the I/O. docs/replication.md describes the protocol.

A frame is ``u32 length`` (big-endian, of what follows) + ``u8 type`` + payload. Strings are
``u16 length`` + UTF-8; integers big-endian.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .files import is_local_only, suspect_files

PROTOCOL_VERSION = 2  # 2: heartbeats and epochs in the stream
NONCE_SIZE = 32
MAX_FRAME = 64 * 1024 * 1024  # a file list of a large data dir fits; anything bigger is an attack
# Until the peer has proved the secret its frames are the handshake's (a hello, a proof, a refusal): a
# larger length is refused as soon as its header arrives, so a stranger never makes a side buffer more.
HANDSHAKE_MAX_FRAME = 4096
CHUNK_SIZE = 1024 * 1024  # full-sync file data is sent in pieces of this size

# frame types
HELLO = 1  # follower -> leader: version u8, nonce, node id
CHALLENGE = 2  # leader -> follower: nonce, proof of the leader
AUTH = 3  # follower -> leader: proof of the follower
AUTH_OK = 4  # leader -> follower
REFUSED = 5  # either way: reason (string); the connection ends
FILE_LIST = 6  # follower -> leader: JSON [[path, size, sha1 hex], ...]
DELETE_LIST = 7  # leader -> follower: JSON [path, ...]
FILE_START = 8  # leader -> follower: path, size u64
FILE_CHUNK = 9  # leader -> follower: data (appended to the file being sent)
FILE_END = 10  # leader -> follower
SYNC_END = 11  # leader -> follower: stream offset u64 from which operations follow
OP = 12  # leader -> follower: stream end offset u64, op kind u8, path, arguments
ACK = 13  # follower -> leader: stream offset u64 applied and fsynced

# stream operation kinds (all absolute: applying one twice leaves the same file)
OP_WRITE = 1  # offset u64 + data: pwrite, creating the file if absent
OP_REPLACE = 2  # data: the file's whole content
OP_TRUNCATE = 3  # size u64: set the size, creating the file if absent
OP_DELETE = 4  # the file goes
OP_RMDIR = 5  # the directory and everything below it go
# Not file changes (no path):
OP_HEARTBEAT = 6  # sent when the stream is idle, so both ends notice silence
OP_EPOCH = 7  # data: u64 epoch; the follower records it as its position before acknowledging

_HEADER = struct.Struct(">IB")
_U64 = struct.Struct(">Q")
_U16 = struct.Struct(">H")
_OP_HEAD = struct.Struct(">QB")


class ProtocolError(Exception):
    """The peer sent something that is not this protocol."""


# ---- framing -------------------------------------------------------------------------------------


def frame(kind: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(len(payload) + 1, kind) + payload


class FrameDecoder:
    """Bytes in, (type, payload) frames out; keeps an incomplete frame for the next feed."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self.max_frame = max_frame  # raised from HANDSHAKE_MAX_FRAME once the peer is authenticated
        self.pending: list[tuple[int, bytes]] = []  # decoded, not yet taken by next_frame()

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
        """Each payload is copied once, out of ``data`` itself when nothing was kept from the last
        feed (a follower's batch of writes is most of its bytes: no copy into a buffer first)."""
        buffer = self._buffer
        if buffer:
            buffer += data
        source = buffer if buffer else data
        frames = []
        pos = 0
        with memoryview(source) as view:
            size = len(view)
            while size - pos >= _HEADER.size:
                length, kind = _HEADER.unpack_from(view, pos)
                if not 1 <= length <= self.max_frame:
                    raise ProtocolError(f"frame length {length} out of range (at most {self.max_frame})")
                end = pos + 4 + length
                if end > size:
                    break
                frames.append((kind, bytes(view[pos + _HEADER.size:end])))
                pos = end
            if source is not buffer and pos < size:  # an incomplete frame: kept for the next feed
                self._buffer = bytearray(view[pos:])
        if source is buffer and pos:
            del buffer[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buffer)


async def next_frame(reader: asyncio.StreamReader, decoder: FrameDecoder,
                     read_size: int = 1024 * 1024) -> tuple[int, bytes]:
    """The next frame from ``reader``; frames that arrived with it wait in ``decoder.pending``."""
    pending = decoder.pending
    while not pending:
        data = await reader.read(read_size)
        if not data:
            raise ConnectionResetError("connection closed by the peer")
        pending.extend(decoder.feed(data))
    return pending.pop(0)


def pack_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _U16.pack(len(raw)) + raw


def unpack_str(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(data, pos)
    end = pos + 2 + n
    if end > len(data):
        raise ProtocolError("string runs past the frame")
    return data[pos + 2:end].decode("utf-8"), end


def pack_u64(value: int) -> bytes:
    return _U64.pack(value)


def unpack_u64(data: bytes | memoryview, pos: int = 0) -> int:
    return _U64.unpack_from(data, pos)[0]


# ---- sockets -------------------------------------------------------------------------------------

# A silent partition must end a replication connection on both sides within seconds: keepalive probes
# for an idle connection, a user timeout for data the peer never acknowledges (the heartbeats in the
# stream make sure there is some).
_TCP_OPTIONS = (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 10_000))


def tune_socket(sock: socket.socket) -> None:
    """Keepalive and a user timeout on a replication connection (where the platform has them)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _TCP_OPTIONS:
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


# ---- authentication ------------------------------------------------------------------------------
# Each side proves it knows the secret by an HMAC over both nonces (its own role in the message so
# that a proof cannot be reflected back); the secret itself never crosses the wire.


def new_nonce() -> bytes:
    return os.urandom(NONCE_SIZE)


def hello(node_id: str, nonce: bytes) -> bytes:
    return frame(HELLO, bytes([PROTOCOL_VERSION]) + nonce + pack_str(node_id))


def parse_hello(payload: bytes) -> tuple[int, bytes, str]:
    if len(payload) < 1 + NONCE_SIZE + 2:
        raise ProtocolError("short hello")
    node_id, _ = unpack_str(payload, 1 + NONCE_SIZE)
    return payload[0], payload[1:1 + NONCE_SIZE], node_id


def leader_proof(secret: bytes, follower_nonce: bytes, leader_nonce: bytes) -> bytes:
    return hmac.new(secret, b"leader" + follower_nonce + leader_nonce, hashlib.sha256).digest()


def follower_proof(secret: bytes, follower_nonce: bytes, leader_nonce: bytes, node_id: str) -> bytes:
    message = b"follower" + follower_nonce + leader_nonce + node_id.encode("utf-8")
    return hmac.new(secret, message, hashlib.sha256).digest()


def challenge(leader_nonce: bytes, proof: bytes) -> bytes:
    return frame(CHALLENGE, leader_nonce + proof)


def parse_challenge(payload: bytes) -> tuple[bytes, bytes]:
    if len(payload) != NONCE_SIZE + 32:
        raise ProtocolError("bad challenge")
    return payload[:NONCE_SIZE], payload[NONCE_SIZE:]


def proof_matches(expected: bytes, given: bytes) -> bool:
    return hmac.compare_digest(expected, given)


# ---- full sync -----------------------------------------------------------------------------------


def replicated_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file under ``root`` that replication copies."""
    root = Path(root)
    for directory, dirs, names in os.walk(root):
        dirs.sort()
        base = Path(directory)
        for name in sorted(names):
            if is_local_only(name):
                continue
            path = base / name
            yield path.relative_to(root).as_posix(), path


def file_sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            digest.update(chunk)
    return digest.hexdigest()


# Listed instead of the hash of a file this node cannot vouch for: equal to no sha1, so the leader sends
# the file again (or deletes it), whatever the page cache says.
UNPROVEN_SHA1 = "unproven"


def list_files(root: Path) -> dict[str, tuple[int, str]]:
    """relative path -> (size, sha1 hex) of every replicated file (blocking: run it in a thread)."""
    listing = {}
    suspects = suspect_files(root)
    for rel, path in replicated_files(root):
        try:
            listing[rel] = (path.stat().st_size, UNPROVEN_SHA1 if rel in suspects else file_sha1(path))
        except FileNotFoundError:  # deleted while walking
            continue
    return listing


def file_list(listing: dict[str, tuple[int, str]]) -> bytes:
    return frame(FILE_LIST, json.dumps([[rel, size, sha] for rel, (size, sha) in listing.items()]).encode())


def parse_file_list(payload: bytes) -> dict[str, tuple[int, str]]:
    try:
        return {check_path(str(rel)): (int(size), str(sha)) for rel, size, sha in json.loads(payload)}
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"bad file list: {exc}") from None


def delete_list(paths: list[str]) -> bytes:
    return frame(DELETE_LIST, json.dumps(paths).encode())


def parse_delete_list(payload: bytes) -> list[str]:
    try:
        return [check_path(str(p)) for p in json.loads(payload)]
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"bad delete list: {exc}") from None


def check_path(rel: str) -> str:
    """A relative path that stays inside the data directory, and is not a local-only file."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise ProtocolError(f"path {rel!r} leaves the data directory")
    if is_local_only(parts[-1]):
        raise ProtocolError(f"path {rel!r} is local to each node")
    return rel


# ---- stream operations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    end: int  # stream offset just after this operation
    kind: int
    path: str
    offset: int = 0  # OP_WRITE
    size: int = 0  # OP_TRUNCATE
    data: bytes | memoryview = b""  # OP_WRITE (a view into its frame), OP_REPLACE


def op_frame_length(path: str, data_len: int, kind: int) -> int:
    """The size of an operation's frame: stream offsets count these bytes."""
    body = _OP_HEAD.size + 2 + len(path.encode("utf-8"))
    if kind == OP_WRITE:
        body += 8 + data_len
    elif kind in (OP_REPLACE, OP_EPOCH):
        body += data_len
    elif kind == OP_TRUNCATE:
        body += 8
    return _HEADER.size + body


def op(end: int, kind: int, path: str, *, offset: int = 0, size: int = 0, data: bytes = b"") -> bytes:
    head = _OP_HEAD.pack(end, kind) + pack_str(path)
    if kind == OP_WRITE:
        head += _U64.pack(offset)
    elif kind == OP_TRUNCATE:
        head += _U64.pack(size)
    if kind not in (OP_WRITE, OP_REPLACE, OP_EPOCH):
        data = b""
    # One join: the data (a flush's segment bytes) is copied once, not once per layer.
    return b"".join((_HEADER.pack(len(head) + len(data) + 1, OP), head, data))


def parse_op(payload: bytes) -> Operation:
    if len(payload) < _OP_HEAD.size + 2:
        raise ProtocolError("short operation")
    end, kind = _OP_HEAD.unpack_from(payload, 0)
    path, pos = unpack_str(payload, _OP_HEAD.size)
    if kind == OP_HEARTBEAT:
        return Operation(end, kind, path)
    if kind == OP_EPOCH:
        if len(payload) - pos != 8:
            raise ProtocolError("bad epoch")
        return Operation(end, kind, path, data=payload[pos:])
    check_path(path)
    if kind == OP_WRITE:
        # A view: the bytes go to pwrite as they are, without one more copy.
        return Operation(end, kind, path, offset=unpack_u64(payload, pos), data=memoryview(payload)[pos + 8:])
    if kind == OP_REPLACE:
        return Operation(end, kind, path, data=payload[pos:])
    if kind == OP_TRUNCATE:
        return Operation(end, kind, path, size=unpack_u64(payload, pos))
    if kind in (OP_DELETE, OP_RMDIR):
        return Operation(end, kind, path)
    raise ProtocolError(f"unknown operation kind {kind}")
