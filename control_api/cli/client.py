"""HTTP client of the control API (httpx), shared by the CLI, tests and tools."""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from safetensors import SafetensorError, safe_open

from .exit_codes import (EXIT_CONFLICT, EXIT_ERROR, EXIT_FILE, EXIT_INVALID, EXIT_OK,
                         EXIT_UNAUTHORIZED, EXIT_UNREACHABLE, EXIT_USAGE)

DEFAULT_URL = "http://127.0.0.1:8001"


_LOCAL_EXITS = {"unreachable": EXIT_UNREACHABLE, "file_error": EXIT_FILE, "bad_usage": EXIT_USAGE}
_HTTP_EXITS = {401: EXIT_UNAUTHORIZED, 403: EXIT_UNAUTHORIZED, 409: EXIT_CONFLICT,
               400: EXIT_INVALID, 413: EXIT_INVALID, 415: EXIT_INVALID, 422: EXIT_INVALID}


class ControlApiError(Exception):
    """A failed call: the server's error code and message (``status`` 0 when local:
    ``unreachable``, ``transport_error``, ``file_error``, ``bad_usage``)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}" + (f" (HTTP {status})" if status else ""))
        self.status, self.code, self.message = status, code, message

    @property
    def exit_code(self) -> int:
        """The CLI's exit status for this failure (constants in :mod:`.exit_codes`)."""
        if self.status == 0:
            return _LOCAL_EXITS.get(self.code, EXIT_ERROR)
        return _HTTP_EXITS.get(self.status, EXIT_ERROR)


class ControlClient:
    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 60.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def push_file(self, vector_id: str, path: Path, *, layers: Sequence[int] | None = None,
                  pin: bool = False, replace: bool = False, key: str | None = None,
                  metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        """Register a ``.safetensors`` (sent as is) or ``.npy`` file (sent as base64 JSON).

        A safetensors file's own metadata (``__metadata__``: what ``hotwire vectors make``
        writes) is stored with the vector, under ``metadata``: where both name a key,
        ``metadata``'s value wins.
        """
        suffix = path.suffix.lower()
        if suffix == ".npy":
            if key is not None:
                raise ControlApiError(0, "bad_usage", "--key applies to .safetensors files")
            try:
                array = np.load(path, allow_pickle=False)
            except OSError as e:
                raise _file_error(path, e) from None
            except ValueError as e:
                raise ControlApiError(0, "file_error", f"{path}: not a .npy array ({e})") from None
            return self.push_array(vector_id, array, layers=layers, pin=pin, replace=replace,
                                   metadata=metadata)
        if suffix != ".safetensors":
            raise ControlApiError(0, "bad_usage", f"{path}: expected a .safetensors or .npy file")
        form = {"id": vector_id, "pin": str(pin).lower(), "replace": str(replace).lower()}
        if layers is not None:
            form["layers"] = json.dumps(list(layers))
        if key is not None:
            form["key"] = key
        metadata = {**file_metadata(path), **(metadata or {})}
        if metadata:
            form["metadata"] = json.dumps(metadata)
        try:
            content = path.read_bytes()
        except OSError as e:
            raise _file_error(path, e) from None
        files = {"file": (path.name, content, "application/octet-stream")}
        return self._call("POST", "/steer/vectors", data=form, files=files).json()

    def push_array(self, vector_id: str, array: np.ndarray, *, layers: Sequence[int] | None = None,
                   pin: bool = False, replace: bool = False,
                   metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        body = {"id": vector_id, "data": base64.b64encode(little.tobytes()).decode(),
                "dtype": array.dtype.name, "shape": list(array.shape), "pin": pin,
                "replace": replace, "metadata": metadata or {}}
        if layers is not None:
            body["layers"] = list(layers)
        return self._call("POST", "/steer/vectors", json=body).json()

    def vectors(self) -> list[dict[str, Any]]:
        return self._call("GET", "/steer/vectors").json()["vectors"]

    def vector(self, vector_id: str) -> dict[str, Any]:
        return self._call("GET", f"/steer/vectors/{vector_id}").json()

    def remove(self, vector_id: str) -> None:
        self._call("DELETE", f"/steer/vectors/{vector_id}")

    def slots(self) -> dict[str, Any]:
        return self._call("GET", "/steer/slots").json()

    def store_preset(self, name: str, entries: Sequence[dict[str, Any]], *,
                     description: str | None = None, replace: bool = False,
                     metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"name": name, "entries": list(entries), "description": description,
                "metadata": metadata or {}, "replace": replace}
        return self._call("POST", "/steer/presets", json=body).json()

    def presets(self) -> list[dict[str, Any]]:
        return self._call("GET", "/steer/presets").json()["presets"]

    def preset(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/steer/presets/{name}").json()

    def remove_preset(self, name: str) -> None:
        self._call("DELETE", f"/steer/presets/{name}")

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise ControlApiError(0, "unreachable", f"cannot reach the control API at "
                                  f"{self.url}: {e}") from None
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
            raise ControlApiError(0, "bad_usage", f"--url {self.url!r}: {e}") from None
        except httpx.TransportError as e:
            raise ControlApiError(0, "transport_error", f"{method} {self.url}{path} failed after "
                                  f"connecting: {e!r}") from None
        if response.is_success:
            return response
        try:
            error = response.json()["error"]
            code, message = error["code"], error["message"]
        except (ValueError, KeyError, TypeError):
            code, message = f"http_{response.status_code}", response.text[:500]
        raise ControlApiError(response.status_code, code, message)

    def close(self) -> None:
        self._http.close()


def file_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (string to string), ``{}`` when it has none or
    cannot be read as one (the upload then says what is wrong with the file)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except (OSError, SafetensorError):
        return {}


def _file_error(path: Path, error: OSError) -> ControlApiError:
    return ControlApiError(0, "file_error", f"{path}: {error.strerror or error}")


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("HOTWIRE_URL", DEFAULT_URL),
                        help=f"control API base URL ($HOTWIRE_URL, default {DEFAULT_URL})")
    parser.add_argument("--token", default=os.environ.get("HOTWIRE_TOKEN"),
                        help="bearer token for writes, and for reads where the server sets a "
                             "read token ($HOTWIRE_TOKEN)")


def client_command(fn: Callable[[ControlClient, argparse.Namespace], None]
                   ) -> Callable[[argparse.Namespace], int]:
    """Make ``fn(client, args)`` a CLI ``run``: exit 0, or the failure's exit code with the
    error on stderr."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        client = ControlClient(args.url, args.token)
        try:
            fn(client, args)
        except ControlApiError as e:
            print(f"hotwire: {e}", file=sys.stderr)
            return e.exit_code
        finally:
            client.close()
        return EXIT_OK

    return run
