"""pgvector's binary wire format, for moving many vectors to and from PostgreSQL without text.

The text form (`[0.0123,...]`) costs a float formatting per value on the way in and a parse on the way out:
for 1,000 vectors of 384 dimensions that is most of an embed job. Here vectors go in as one binary vector[]
parameter built with numpy (`VectorArray`), and come out as `vector_send(embedding)` bytes on a binary
cursor (`decode_vectors`). These run on the session's own psycopg connection (`driver_connection`), inside
its transaction, with a cursor-local dumper: nothing is registered on the connection or globally.
"""

from __future__ import annotations

import struct
from functools import lru_cache

import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format
from sqlalchemy.orm import Session

_OIDS_KEY = "engram_vector_oids"
_OIDS = "SELECT 'vector'::regtype::oid, 'vector[]'::regtype::oid"


class VectorArray:
    """An (n, dims) float32 matrix sent as a binary vector[] parameter."""

    def __init__(self, vectors: np.ndarray, *, vector_oid: int) -> None:
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.vector_oid = vector_oid


class _VectorArrayDumper(Dumper):
    """PostgreSQL's binary array format around pgvector's binary vectors (uint16 dims, uint16 unused,
    big-endian float32 values), each prefixed with its int32 length."""

    format = Format.BINARY

    def dump(self, obj: VectorArray) -> bytes:
        n, dims = obj.vectors.shape
        if not n:
            return struct.pack(">iiI", 0, 0, obj.vector_oid)  # no dimensions: the empty array
        header = struct.pack(">iiIii", 1, 0, obj.vector_oid, n, 1)  # 1-D, no nulls, element type, size, lower bound
        return header + vector_records(obj.vectors).tobytes()


def vector_records(vectors: np.ndarray) -> np.ndarray:
    """One record per row of an (n, dims) matrix, each a length-prefixed binary pgvector value (int32 length,
    uint16 dims, uint16 unused, big-endian float32s): the element form of a binary array and the field form
    of binary COPY alike."""
    n, dims = vectors.shape
    records = np.empty(n, dtype=[("length", ">i4"), ("dims", ">u2"), ("unused", ">u2"), ("values", ">f4", (dims,))])
    records["length"] = 4 + 4 * dims
    records["dims"] = dims
    records["unused"] = 0
    records["values"] = vectors
    return records


@lru_cache(maxsize=8)
def _dumper_for(array_oid: int) -> type[Dumper]:
    """The dumper class for a database whose vector[] type has `array_oid` (the oids are per database)."""
    return type("VectorArrayDumper", (_VectorArrayDumper,), {"oid": array_oid})


def driver_connection(session: Session) -> psycopg.Connection:
    """The session's psycopg connection, in its current transaction (pending ORM changes flushed first)."""
    session.flush()
    connection = session.connection().connection.driver_connection
    assert isinstance(connection, psycopg.Connection)
    return connection


def vector_cursor(session: Session) -> tuple[psycopg.Cursor, int]:
    """A cursor on the session's connection that can send `VectorArray`s, and the vector type's oid."""
    pooled = session.connection().connection
    connection = driver_connection(session)
    cursor = connection.cursor()
    oids = pooled.info.get(_OIDS_KEY)
    if oids is None:
        row = cursor.execute(_OIDS).fetchone()
        assert row is not None
        oids = pooled.info[_OIDS_KEY] = (int(row[0]), int(row[1]))
    cursor.adapters.register_dumper(VectorArray, _dumper_for(oids[1]))
    return cursor, oids[0]


def decode_vectors(blobs: list[bytes], dims: int) -> np.ndarray:
    """`vector_send` bytes (uint16 dims, uint16 unused, big-endian float32 values) -> (n, dims) float32."""
    if not blobs:
        return np.zeros((0, dims), dtype=np.float32)
    raw = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), 4 + 4 * dims)
    return np.ascontiguousarray(raw[:, 4:]).view(">f4").astype(np.float32)
