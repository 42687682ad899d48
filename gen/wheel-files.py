#!/usr/bin/env python3
"""Fetches some files of a wheel on PyPI without downloading the whole wheel: reads the zip's
directory at its end, then each wanted file, with HTTP range requests, and checks each file
against the wheel's RECORD (sha256 and size). NVIDIA's wheels are hundreds of megabytes, of which
a build needs a few headers, or one library.
  wheel-files.py PACKAGE VERSION PATTERN DEST PLATFORM...
PATTERN is a regular expression the wanted paths match from their start; the files are written
under DEST with their paths. Exit 0 when every wanted file was written, 1 otherwise (a DEST this
made is removed then; the caller may download the whole wheel instead).
"""

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import struct
import sys
import urllib.request
import zlib

INDEX = os.environ.get("NCCLSHIM_PYPI_SIMPLE", "https://pypi.org/simple")
TIMEOUT = 60


def get(url, first=None, last=None, tail=None):
    """The body of `url`: bytes [first, last], or the last `tail` bytes, or all of it."""
    headers = {}
    if tail is not None:
        headers["Range"] = f"bytes=-{tail}"
    elif first is not None:
        headers["Range"] = f"bytes={first}-{last}"
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        body = response.read()
        if headers and response.status != 206:
            raise OSError(f"{url}: no range answer (HTTP {response.status})")
        return body


def wheel_url(package, version, platforms):
    """The URL and size of PACKAGE==VERSION's wheel for the first of `platforms` it has."""
    request = urllib.request.Request(
        f"{INDEX}/{package}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        files = json.load(response)["files"]
    stem = f"{package.replace('-', '_')}-{version}-"
    for platform in platforms:
        for f in files:
            name = f["filename"]
            if name.startswith(stem) and name.endswith(".whl") and platform in name:
                return f["url"], f["size"]
    raise OSError(f"no wheel of {package}=={version} for {' '.join(platforms)}")


def directory(url, size):
    """The zip's entries: (name, local header offset, compressed size, size, method)."""
    tail = get(url, tail=min(size, 1 << 16))
    at = tail.rfind(b"PK\x05\x06")
    if at < 0:
        raise OSError("no end of the zip's directory")
    # The end record: signature, disk numbers, entries here, entries, directory size and offset.
    entries, dir_size, dir_offset = struct.unpack_from("<HII", tail, at + 10)
    if dir_offset == 0xFFFFFFFF or entries == 0xFFFF:
        raise OSError("a zip64 wheel")
    raw = get(url, dir_offset, dir_offset + dir_size - 1)
    found, pos = [], 0
    while pos + 46 <= len(raw) and raw[pos:pos + 4] == b"PK\x01\x02":
        method, = struct.unpack_from("<H", raw, pos + 10)
        packed, unpacked, name_len, extra_len, comment_len = struct.unpack_from("<IIHHH", raw, pos + 20)
        offset, = struct.unpack_from("<I", raw, pos + 42)
        name = raw[pos + 46:pos + 46 + name_len].decode()
        found.append((name, offset, packed, unpacked, method))
        pos += 46 + name_len + extra_len + comment_len
    return found


def read_entry(url, entry):
    """One entry's bytes, inflated."""
    name, offset, packed, unpacked, method = entry
    header = get(url, offset, offset + 29)
    if header[:4] != b"PK\x03\x04":
        raise OSError(f"{name}: no local header")
    name_len, extra_len = struct.unpack_from("<HH", header, 26)
    start = offset + 30 + name_len + extra_len
    data = get(url, start, start + packed - 1) if packed else b""
    if method == 8:
        data = zlib.decompress(data, -15)
    elif method != 0:
        raise OSError(f"{name}: compression method {method}")
    if len(data) != unpacked:
        raise OSError(f"{name}: {len(data)} bytes, not {unpacked}")
    return data


def recorded(record_text):
    """RECORD's sha256 of each path (urlsafe base64, unpadded)."""
    hashes = {}
    for line in record_text.splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1].startswith("sha256="):
            hashes[parts[0]] = parts[1][len("sha256="):]
    return hashes


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    package, version, pattern, dest, platforms = argv[0], argv[1], re.compile(argv[2]), argv[3], argv[4:]
    fresh = not os.path.exists(dest)
    try:
        url, size = wheel_url(package, version, platforms)
        entries = directory(url, size)
        record = [e for e in entries if e[0].endswith(".dist-info/RECORD")]
        wanted = [e for e in entries if pattern.match(e[0]) and not e[0].endswith("/")]
        unsafe = [e[0] for e in wanted if e[0].startswith("/") or ".." in e[0].split("/")]
        if unsafe:
            raise OSError(f"paths outside the destination: {unsafe[0]}")
        if not record or not wanted:
            raise OSError(f"the wheel has no RECORD or no file matching {pattern.pattern}")
        hashes = recorded(read_entry(url, record[0]).decode())
        for entry in wanted:
            data = read_entry(url, entry)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if hashes.get(entry[0]) != digest:
                raise OSError(f"{entry[0]}: its sha256 is not the one RECORD gives")
            path = os.path.join(dest, entry[0])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as out:
                out.write(data)
            if "/lib/" in entry[0]:
                os.chmod(path, 0o755)
        total = sum(e[2] for e in wanted)
        print(f"wheel-files: {len(wanted)} files of {package}=={version} ({total / 1e6:.1f} MB of "
              f"{size / 1e6:.0f} MB)", file=sys.stderr)
        return 0
    except (OSError, ValueError, KeyError, zlib.error, struct.error, http.client.HTTPException) as e:
        print(f"wheel-files: {package}=={version}: {e}", file=sys.stderr)
        if fresh:
            shutil.rmtree(dest, ignore_errors=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
