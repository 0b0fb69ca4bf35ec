"""shared.store: one contract, two backends (a local directory and MinIO/S3 over HTTP)."""

from __future__ import annotations

import hashlib
import io
import random
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from minio import Minio

from shared.errors import NotFoundError, StoreError, UserError
from shared.settings import Settings
from shared.store import LocalStore, MinioStore, ObjectStore, open_store

ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def minio_client(endpoint: str, **options) -> Minio:
    return Minio(endpoint, access_key="test", secret_key="test", secure=False, **options)


def unique_bucket() -> str:
    return f"test-{uuid.uuid4().hex[:16]}"


def read_object(client: Minio, bucket: str, name: str) -> bytes:
    response = client.get_object(bucket, name)
    try:
        return response.read()
    finally:
        response.close()
        response.release_conn()


def remove_bucket(client: Minio, bucket: str) -> None:
    for item in client.list_objects(bucket, recursive=True):
        client.remove_object(bucket, item.object_name)
    client.remove_bucket(bucket)


@pytest.fixture(params=["local", "minio"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalStore(tmp_path / "store")
        return
    client = minio_client(request.getfixturevalue("s3_endpoint"))
    bucket = unique_bucket()
    yield MinioStore(client, bucket)
    remove_bucket(client, bucket)


def test_round_trip(store: ObjectStore):
    digest = store.put(b"hello, kernels")

    assert store.get(digest) == b"hello, kernels"


def test_hash_is_the_sha256(store: ObjectStore):
    assert store.put(b"abc") == ABC_SHA256 == hashlib.sha256(b"abc").hexdigest()


def test_empty_object(store: ObjectStore):
    assert store.put(b"") == EMPTY_SHA256
    assert store.get(EMPTY_SHA256) == b""


def test_put_is_idempotent(store: ObjectStore):
    first = store.put(b"same bytes")
    second = store.put(b"same bytes")

    assert first == second
    assert store.get(first) == b"same bytes"


def test_distinct_content_distinct_objects(store: ObjectStore):
    one, two = store.put(b"one"), store.put(b"two")

    assert one != two
    assert (store.get(one), store.get(two)) == (b"one", b"two")


def test_missing_object_is_not_found(store: ObjectStore):
    with pytest.raises(NotFoundError, match=ABC_SHA256):
        store.get(ABC_SHA256)


def test_exists(store: ObjectStore):
    assert not store.exists(ABC_SHA256)

    store.put(b"abc")

    assert store.exists(ABC_SHA256)


@pytest.mark.parametrize(
    "digest",
    ["", "abc", ABC_SHA256.upper(), ABC_SHA256[:-1], ABC_SHA256 + "0", "g" * 64, ABC_SHA256 + "\n",
     "../" + ABC_SHA256[3:], "sha256/" + ABC_SHA256],
    ids=["empty", "short", "upper", "63", "65", "non-hex", "newline", "dotdot", "prefixed"],
)
@pytest.mark.parametrize("operation", ["get", "exists"])
def test_bad_digest_is_a_user_error(store: ObjectStore, operation: str, digest: str):
    with pytest.raises(UserError, match="not a SHA-256 hex digest"):
        getattr(store, operation)(digest)


def test_large_object(store: ObjectStore):
    data = random.Random(0).randbytes(12 * 1024 * 1024 + 3)  # above MinIO's 5 MiB part: a multipart upload

    digest = store.put(data)

    assert digest == hashlib.sha256(data).hexdigest()
    assert store.get(digest) == data


# Backend specifics.


def test_local_store_layout(tmp_path: Path):
    store = LocalStore(tmp_path / "store")

    store.put(b"abc")

    assert (tmp_path / "store" / ABC_SHA256[:2] / ABC_SHA256[2:]).read_bytes() == b"abc"
    assert not list((tmp_path / "store").rglob(".tmp-*"))


def test_minio_store_reuses_an_existing_bucket(s3_endpoint: str):
    client, bucket = minio_client(s3_endpoint), unique_bucket()
    digest = MinioStore(client, bucket).put(b"kept")

    assert MinioStore(client, bucket).get(digest) == b"kept"

    remove_bucket(client, bucket)


def test_minio_store_detects_corruption(s3_endpoint: str):
    client, bucket = minio_client(s3_endpoint), unique_bucket()
    store = MinioStore(client, bucket)
    client.put_object(bucket, f"sha256/{ABC_SHA256}", io.BytesIO(b"abd"), 3)

    with pytest.raises(StoreError, match="corrupt"):
        store.get(ABC_SHA256)

    remove_bucket(client, bucket)


def test_minio_store_unreachable_is_a_store_error(unused_port: int):
    http_client = urllib3.PoolManager(timeout=urllib3.Timeout(connect=0.5, read=0.5), retries=False)
    client = minio_client(f"127.0.0.1:{unused_port}", http_client=http_client)
    started = time.monotonic()

    with pytest.raises(StoreError, match="unreachable"):
        MinioStore(client, "bucket")

    assert time.monotonic() - started < 5
    http_client.clear()


# open_store.


def test_open_store_defaults_to_a_local_store_under_home(tmp_path: Path):
    store = open_store(Settings(home=tmp_path / "home"))

    digest = store.put(b"abc")

    assert isinstance(store, LocalStore)
    assert (tmp_path / "home" / "store" / digest[:2] / digest[2:]).read_bytes() == b"abc"


def test_open_store_file_url(tmp_path: Path):
    store = open_store(Settings(store_url=f"file://{tmp_path / 'objects'}"))

    store.put(b"abc")

    assert isinstance(store, LocalStore)
    assert (tmp_path / "objects" / ABC_SHA256[:2] / ABC_SHA256[2:]).exists()


def test_open_store_s3_url(s3_endpoint: str):
    bucket = unique_bucket()
    store = open_store(Settings(store_url=f"s3://{bucket}", minio_endpoint=s3_endpoint))

    digest = store.put(b"abc")

    assert isinstance(store, MinioStore)
    assert store.bucket == bucket
    assert read_object(minio_client(s3_endpoint), bucket, f"sha256/{digest}") == b"abc"
    remove_bucket(minio_client(s3_endpoint), bucket)


def test_open_store_unknown_scheme():
    with pytest.raises(UserError, match="file:// or s3://"):
        open_store(Settings(store_url="ftp://host/objects"))


def test_build_outputs_are_kept_by_their_build_key(store):
    key = hashlib.sha256(b"sources+flags+arch").hexdigest()
    assert store.get_build(key) is None
    store.put_build(key, b"\x7fELF cubin bytes")
    assert store.get_build(key) == b"\x7fELF cubin bytes"
    store.put_build(key, b"rebuilt")  # a rebuild replaces the cached output
    assert store.get_build(key) == b"rebuilt"
    with pytest.raises(UserError):
        store.get_build("../../etc/passwd")
