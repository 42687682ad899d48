#!/usr/bin/env python3
"""Packs a build of ncclshim into a Python wheel (standard library only):
  make-wheel.py --lib LIB --bin BIN --version V --abi TEXT --out DIR
LIB (the shim's library, a build for every NCCL version) goes to ncclshim/lib/libnccl.so.2 in
site-packages, BIN (the ncclshim command) to the environment's bin/. NVIDIA's NCCL comes as an
extra (ncclshim[cu12] or ncclshim[cu13]), in the same environment, where the shim finds it.
Prints the wheel's path."""
import argparse
import base64
import hashlib
import os
import stat
import sys
import zipfile

# The build machine's glibc (Debian 12): the library needs at least this one.
PLATFORM = "manylinux_2_36_x86_64"

INIT = '''"""ncclshim: a drop-in libnccl.so.2 in front of NVIDIA's NCCL ({abi}).

Run a program with it: `ncclshim run -- torchrun ...`; check a machine: `ncclshim doctor`."""
import os

__version__ = "{version}"


def library_path():
    """The shim's libnccl.so.2, for LD_PRELOAD."""
    return os.path.join(os.path.dirname(__file__), "lib", "libnccl.so.2")
'''

METADATA = """Metadata-Version: 2.1
Name: ncclshim
Version: {version}
Summary: A drop-in libnccl.so.2: faster intra-node collectives over NVLink, NVIDIA's NCCL for the rest ({abi})
License: Apache-2.0
Requires-Python: >=3.8
Provides-Extra: cu12
Requires-Dist: nvidia-nccl-cu12; extra == "cu12"
Provides-Extra: cu13
Requires-Dist: nvidia-nccl-cu13; extra == "cu13"

Run a program with the shim in front: `ncclshim run -- CMD ...`. Check a machine:
`ncclshim doctor`. The real NCCL is found in the same Python environment (the cu12 or cu13
extra installs NVIDIA's), or named by NCCLSHIM_REAL_NCCL.
"""

WHEEL = f"""Wheel-Version: 1.0
Generator: ncclshim make-wheel.py
Root-Is-Purelib: false
Tag: py3-none-{PLATFORM}
"""


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main():
    parser = argparse.ArgumentParser()
    for arg in ("--lib", "--bin", "--version", "--abi", "--out"):
        parser.add_argument(arg, required=True)
    args = parser.parse_args()
    dist = f"ncclshim-{args.version}"
    files = [
        ("ncclshim/__init__.py", INIT.format(abi=args.abi, version=args.version).encode(), 0o644),
        ("ncclshim/lib/libnccl.so.2", open(args.lib, "rb").read(), 0o755),
        (f"{dist}.data/scripts/ncclshim", open(args.bin, "rb").read(), 0o755),
        (f"{dist}.dist-info/METADATA", METADATA.format(version=args.version, abi=args.abi).encode(), 0o644),
        (f"{dist}.dist-info/WHEEL", WHEEL.encode(), 0o644),
        (f"{dist}.dist-info/top_level.txt", b"ncclshim\n", 0o644),
    ]
    record = f"{dist}.dist-info/RECORD"
    lines = [record_line(name, data) for name, data, _ in files] + [f"{record},,"]
    files.append((record, ("\n".join(lines) + "\n").encode(), 0o644))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{dist}-py3-none-{PLATFORM}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    print(path)


if __name__ == "__main__":
    sys.exit(main())
