#!/usr/bin/env bash
# Makes the virtual environment of the tools that build and check the wheel, once, in the cache,
# and prints its bin/ folder: zig and cargo-zigbuild (the wheel's library and command are linked
# against an old glibc's symbols), auditwheel (which manylinux tag a wheel's files allow).
#   gen/fetch-wheel-tools.sh   ->   ~/.cache/ncclshim/wheel-tools-<versions>/bin
set -euo pipefail
# Pinned: a new zig or cargo-zigbuild may change what the wheel links to.
tools=(ziglang==0.15.2 cargo-zigbuild==0.24.1 auditwheel==6.8.2)
cache=${NCCLSHIM_CACHE:-$HOME/.cache/ncclshim}
stem=wheel-tools-$(printf '%s\n' "${tools[@]}" | sha256sum | cut -c1-12)
venv=$cache/$stem
mkdir -p "$cache"
# One maker at a time; a second one waits, then finds the environment there.
exec 9>"$cache/.$stem.lock"
flock 9
# Made in place (a venv's scripts name its path), then marked whole.
if [ ! -f "$venv/.complete" ]; then
  # Debian keeps venv (and the pip it seeds) apart from python3.
  python3 -c 'import ensurepip, venv' 2>/dev/null || {
    echo "fetch-wheel-tools: installing python3-venv" >&2
    apt-get update -qq >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  }
  echo "fetch-wheel-tools: installing ${tools[*]} into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${tools[@]}" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin"
