"""Content-addressed object store: bytes in, SHA-256 out. A local directory or MinIO/S3."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from shared.errors import NotFoundError, StoreError, UserError
from shared.home import private_folder
from shared.settings import Settings

_HASH = re.compile(r"^[0-9a-f]{64}$")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_hash(digest: str) -> str:
    if not _HASH.fullmatch(digest):  # not match(): `$` also matches before a final newline
        raise UserError(f"not a SHA-256 hex digest: {digest!r}")
    return digest


class ObjectStore(Protocol):
    """Objects by content hash; build outputs (cubins) by the hash of their build inputs."""

    def put(self, data: bytes) -> str: ...
    def get(self, digest: str) -> bytes: ...
    def exists(self, digest: str) -> bool: ...
    def put_build(self, key: str, data: bytes) -> None: ...
    def get_build(self, key: str) -> bytes | None: ...


class LocalStore:
    """Objects under `root/ab/cdef...`; writes go through a temp file and an atomic rename."""

    def __init__(self, root: Path) -> None:
        self.root = private_folder(Path(root))  # made 0700 (shared/home.py)

    def _path(self, digest: str) -> Path:
        _check_hash(digest)
        return self.root / digest[:2] / digest[2:]

    def put(self, data: bytes) -> str:
        digest = sha256(data)
        path = self._path(digest)
        if not path.exists():
            _write_atomic(path, data)
        return digest

    def put_build(self, key: str, data: bytes) -> None:
        _write_atomic(self.root / "builds" / _check_hash(key), data)

    def get_build(self, key: str) -> bytes | None:
        path = self.root / "builds" / _check_hash(key)
        return path.read_bytes() if path.exists() else None

    def get(self, digest: str) -> bytes:
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"object {digest} not in the store") from None

    def exists(self, digest: str) -> bool:
        return self._path(digest).exists()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


class MinioStore:
    """Objects named `sha256/<digest>` in one bucket, created when missing."""

    def __init__(self, client, bucket: str) -> None:
        from minio.error import MinioException, S3Error
        from urllib3.exceptions import HTTPError

        self._client, self.bucket, self._s3_error = client, bucket, S3Error
        # Transport faults (refused, timed out, dropped) come from urllib3 and are not OSErrors;
        # a non-S3 error reply (a proxy's bare 503) is a MinioException.
        self._io_errors = (OSError, HTTPError, MinioException)
        try:
            if not client.bucket_exists(bucket):
                client.make_bucket(bucket)
        except S3Error as error:
            if error.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StoreError(f"cannot create bucket {bucket}: {error}") from error
        except self._io_errors as error:
            raise StoreError(f"object store unreachable: {error}") from error

    @staticmethod
    def _name(digest: str) -> str:
        return f"sha256/{_check_hash(digest)}"

    def put(self, data: bytes) -> str:
        digest = sha256(data)
        if not self.exists(digest):
            self._write(self._name(digest), data)
        return digest

    def get(self, digest: str) -> bytes:
        data = self._read(self._name(digest))
        if data is None:
            raise NotFoundError(f"object {digest} not in the store")
        if sha256(data) != digest:
            raise StoreError(f"object {digest} is corrupt in the store")
        return data

    def put_build(self, key: str, data: bytes) -> None:
        self._write(f"builds/{_check_hash(key)}", data)

    def get_build(self, key: str) -> bytes | None:
        return self._read(f"builds/{_check_hash(key)}")

    def _write(self, name: str, data: bytes) -> None:
        try:
            self._client.put_object(self.bucket, name, io.BytesIO(data), len(data))
        except self._io_errors as error:
            raise StoreError(f"cannot write {name}: {error}") from error

    def _read(self, name: str) -> bytes | None:
        """The object's bytes, or None when there is no such object."""
        response = None
        try:
            response = self._client.get_object(self.bucket, name)
            return response.read()
        except self._s3_error as error:
            if error.code == "NoSuchKey":
                return None
            raise StoreError(f"cannot read {name}: {error}") from error
        except self._io_errors as error:
            raise StoreError(f"cannot read {name}: {error}") from error
        finally:
            if response is not None:
                response.close()
                response.release_conn()

    def exists(self, digest: str) -> bool:
        try:
            self._client.stat_object(self.bucket, self._name(digest))
            return True
        except self._s3_error as error:
            if error.code in ("NoSuchKey", "NoSuchObject", "NotFound"):
                return False
            raise StoreError(f"cannot stat {digest}: {error}") from error
        except self._io_errors as error:
            raise StoreError(f"cannot stat {digest}: {error}") from error


def open_store(settings: Settings) -> ObjectStore:
    """`file:///dir` or `s3://bucket` (MinIO endpoint and keys from settings)."""
    url = urlparse(settings.object_store_url)
    if url.scheme == "file":
        return LocalStore(Path(url.path))
    if url.scheme == "s3":
        from minio import Minio

        client = Minio(settings.minio_endpoint, access_key=settings.minio_access_key,
                       secret_key=settings.minio_secret_key, secure=settings.minio_secure)
        return MinioStore(client, url.netloc)
    raise UserError(f"store URL must be file:// or s3://, got {settings.object_store_url!r}")
