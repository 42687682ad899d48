#!/usr/bin/env bash
# Fetches part of one of NVIDIA's wheels from PyPI into the cache, once.
#   gen/fetch-wheel.sh PACKAGE VERSION PATTERN DEST PLATFORM...
# Puts the files of PACKAGE==VERSION (built for one of the PLATFORMs) whose paths match PATTERN
# (a Python regular expression, from the start of the path) into DEST, whole or not at all,
# unless DEST is there already: only those files, by range requests (gen/wheel-files.py), where
# PyPI answers them; else from the whole wheel, downloaded into $NCCLSHIM_CACHE/wheels
# (~/.cache/ncclshim/wheels) unless it is there. Used by gen/fetch-nccl.sh and gen/fetch-nvrtc.sh.
set -euo pipefail
[ $# -ge 5 ] || { echo "usage: fetch-wheel.sh PACKAGE VERSION PATTERN DEST PLATFORM..." >&2; exit 2; }
package=$1 version=$2 pattern=$3 dest=$4
shift 4
cache=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}
mkdir -p "$cache/wheels"
if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "fetch-wheel: installing pip (python3-pip)" >&2
  apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
fi
stem=${package//-/_}-$version
# One fetch of a wheel at a time (tests fetch in parallel): a second one waits, then finds DEST
# there (it appears whole, by a rename) and leaves it alone, as a reader may be using it.
exec 9>"$cache/wheels/.$stem.lock"
flock 9
[ -d "$dest" ] && exit 0
wheel=$(ls "$cache"/wheels/"$stem"-*.whl 2>/dev/null | head -1 || true)
rm -rf "$dest.tmp"
if [ -z "$wheel" ] && python3 "$(dirname "$0")/wheel-files.py" "$package" "$version" "$pattern" "$dest.tmp" "$@"; then
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  exit 0
fi
if [ -z "$wheel" ]; then
  echo "fetch-wheel: downloading $package==$version" >&2
  platforms=()
  for p in "$@"; do platforms+=(--platform "$p"); done
  python3 -m pip download --quiet --no-deps --only-binary=:all: "${platforms[@]}" \
    -d "$cache/wheels" "$package==$version" >&2
  wheel=$(ls "$cache"/wheels/"$stem"-*.whl | head -1)
fi
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
python3 - "$wheel" "$dest.tmp" "$pattern" <<'PY'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if re.match(sys.argv[3], n)])
PY
rm -rf "$dest" && mv "$dest.tmp" "$dest"
