"""`python -m vit_jax.storage.emulator_server --port P --bucket B`: gcp-storage-emulator (in memory) with the two
GCS behaviours that it lacks and that tensorstore's OCDBT format (how Orbax writes checkpoint arrays) relies on.

Measured with gcp-storage-emulator 2026.7 and tensorstore 0.1.86: a second OCDBT writer that reads a database's
`manifest.ocdbt` back fails with "Malformed StorageGeneration" (every 2-process checkpoint save did), because
1. a media download carries no `x-goog-generation` header (real GCS sends it on every object read, and tensorstore
   takes the object's generation from it), and
2. generation preconditions are ignored: `ifGenerationMatch` / `ifGenerationNotMatch` on reads (GCS answers 412 /
   304) and `ifGenerationMatch` on media and multipart uploads (`0`: only if absent; GCS answers 412).
This module wraps the emulator's download and insert handlers to add both, as GCS documents them, and serves
otherwise unchanged. `Emulator` (emulator.py) runs it.
"""

from __future__ import annotations

import argparse
import sys
from http import HTTPStatus


def _current_generation(storage, bucket: str, name: str) -> str | None:
    from gcp_storage_emulator.exceptions import NotFound

    try:
        return str(storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
        return None


def _query(request, key: str) -> str | None:
    values = request.query.get(key)
    return values[0] if values else None


def _with_generation(download):
    def handler(request, response, storage, *args, **kwargs):
        current = _current_generation(storage, request.params["bucket_name"], request.params["object_id"])
        match, not_match = _query(request, "ifGenerationMatch"), _query(request, "ifGenerationNotMatch")
        if current is not None and match is not None and match != current:
            response.status = HTTPStatus.PRECONDITION_FAILED
            return None
        if current is not None and not_match is not None and not_match == current:
            response.status = HTTPStatus.NOT_MODIFIED
            response["x-goog-generation"] = current
            return None
        out = download(request, response, storage, *args, **kwargs)
        if current is not None:
            response["x-goog-generation"] = current
            response["x-goog-metageneration"] = "1"
        return out

    return handler


def _with_preconditions(insert):
    def handler(request, response, storage, *args, **kwargs):
        match = _query(request, "ifGenerationMatch")
        upload_type = _query(request, "uploadType")
        if match is not None and upload_type in ("media", "multipart"):
            name = _query(request, "name")
            if name is None and upload_type == "multipart" and isinstance(request.data, dict):
                name = request.data["meta"].get("name")
            current = _current_generation(storage, request.params["bucket_name"], name) if name else None
            if (match == "0" and current is not None) or (match != "0" and current != match):
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "Precondition Failed"}})
                return None
        return insert(request, response, storage, *args, **kwargs)

    return handler


def patch_handlers() -> None:
    """Routes the emulator's object downloads and inserts through the wrappers above (idempotent)."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    if getattr(objects, "_vit_jax_patched", False):
        return
    wrapped = {objects.download: _with_generation(objects.download), objects.insert: _with_preconditions(
        objects.insert)}
    objects.download = wrapped[objects.download]  # objects.get(alt=media) calls it by this name
    objects.insert = wrapped[objects.insert]
    server.HANDLERS = tuple((rx, {m: wrapped.get(f, f) for m, f in handlers.items()})
                            for rx, handlers in server.HANDLERS)
    objects._vit_jax_patched = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bucket", required=True)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from gcp_storage_emulator.server import create_server

    patch_handlers()
    create_server(args.host, args.port, True, args.bucket).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
