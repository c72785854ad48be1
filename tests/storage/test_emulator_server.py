"""The GCS behaviour that vit_jax/storage/emulator_server.py adds to gcp-storage-emulator, checked request by request
against the JSON API's documented semantics (Cloud Storage docs, "Request preconditions"; the client libraries'
"generation / metageneration" pages):

- every upload of an object gives it a new generation (a number that rises);
- `ifGenerationMatch=G` on an upload or a read proceeds only if the live object's generation is G, else 412
  Precondition Failed; `ifGenerationMatch=0` means "only if there is no live object";
- `ifGenerationNotMatch=G` on a read proceeds only if the generation is not G, else 304 Not Modified;
- a media download carries the object's generation in `x-goog-generation` (tensorstore reads it from there).

Raw HTTP straight to the emulator (not through the session's fault proxy), so nothing between client and server
can retry, rewrite or hide a status.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

BOUNDARY = "vit_jax_test_boundary"


class Client:
    """The few JSON API calls these tests make, on one object name; each returns (status, headers, body)."""

    def __init__(self, url: str, bucket: str, name: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port, self.bucket, self.name = parts.hostname, parts.port, bucket, name

    def _call(self, method: str, path: str, query: dict, body: bytes | None = None,
              content_type: str = "application/octet-stream"):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            headers = {"Content-Type": content_type} if body is not None else {}
            conn.request(method, f"{path}?{urllib.parse.urlencode(query)}", body=body, headers=headers)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def upload(self, data: bytes, **preconditions):
        """A media upload (`uploadType=media`, the name in the query)."""
        return self._call("POST", f"/upload/storage/v1/b/{self.bucket}/o",
                          {"uploadType": "media", "name": self.name, **preconditions}, data)

    def upload_multipart(self, data: bytes, **preconditions):
        """A multipart upload: the name in the JSON metadata part, the content in the second part."""
        body = (f"--{BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                f"{json.dumps({'name': self.name})}\r\n--{BOUNDARY}\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()
        return self._call("POST", f"/upload/storage/v1/b/{self.bucket}/o",
                          {"uploadType": "multipart", **preconditions}, body,
                          content_type=f"multipart/related; boundary={BOUNDARY}")

    def download(self, **preconditions):
        return self._call("GET", f"/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(self.name, safe='')}",
                          {"alt": "media", **preconditions})

    def generation(self) -> int:
        """The live object's generation, from its metadata."""
        status, _, body = self._call("GET", f"/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(self.name, safe='')}",
                                     {})
        assert status == 200, status
        return int(json.loads(body)["generation"])


@pytest.fixture
def obj(gcs, request) -> Client:
    """An object name of this test's own in the session's bucket, on the emulator itself."""
    return Client(gcs.emulator.url, gcs.emulator.bucket, f"emulator_server/{request.node.name}/object")


def uploaded_generation(response) -> int:
    status, _, body = response
    assert status == 200, (status, body)
    # (Not checked: metageneration, which GCS starts at 1 for each generation; the emulator's own multipart path
    # answers 2, and emulator_server.py neither changes it nor is relied on for it.)
    return int(json.loads(body)["generation"])


def test_each_upload_makes_a_new_rising_generation(obj):
    first = uploaded_generation(obj.upload(b"one"))
    second = uploaded_generation(obj.upload(b"two"))
    third = uploaded_generation(obj.upload_multipart(b"three"))
    assert first < second < third == obj.generation()
    status, headers, body = obj.download()
    assert (status, body, int(headers["x-goog-generation"])) == (200, b"three", third)


def test_if_generation_match_0_writes_only_an_absent_object(obj):
    created = uploaded_generation(obj.upload(b"first", ifGenerationMatch="0"))  # absent: created
    for upload in (obj.upload, obj.upload_multipart):
        status, _, _ = upload(b"second", ifGenerationMatch="0")  # now present: refused
        assert status == 412
    assert obj.generation() == created and obj.download()[2] == b"first"  # untouched


def test_if_generation_match_writes_only_over_that_generation(obj):
    old = uploaded_generation(obj.upload(b"v1"))
    new = uploaded_generation(obj.upload(b"v2", ifGenerationMatch=str(old)))  # current: proceeds
    assert new > old
    for upload in (obj.upload, obj.upload_multipart):  # stale (a writer that read v1): refused
        status, _, _ = upload(b"lost update", ifGenerationMatch=str(old))
        assert status == 412
    assert obj.generation() == new and obj.download()[2] == b"v2"
    status, _, _ = obj.upload(b"v3", ifGenerationMatch=str(new + 1))  # a generation that never existed
    assert status == 412


def test_if_generation_match_on_an_absent_object_fails(obj):
    status, _, _ = obj.upload(b"data", ifGenerationMatch="12345")  # no live object has that generation
    assert status == 412
    assert obj.download()[0] == 404  # and nothing was created


def test_reads_honour_generation_preconditions(obj):
    generation = uploaded_generation(obj.upload(b"content"))
    status, headers, body = obj.download(ifGenerationMatch=str(generation))
    assert (status, body, headers["x-goog-generation"]) == (200, b"content", str(generation))
    assert obj.download(ifGenerationMatch=str(generation - 1))[0] == 412
    assert obj.download(ifGenerationNotMatch=str(generation))[0] == 304
    status, _, body = obj.download(ifGenerationNotMatch=str(generation - 1))
    assert (status, body) == (200, b"content")
