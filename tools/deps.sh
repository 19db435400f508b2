# Sourced by tools/run and tools/test: installs the Debian packages coload needs, if missing,
# and sets up the build folder the two share.
# usage: ensure_packages pkg...
ensure_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "coload: installing ${missing[*]}" >&2
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

COLOAD_BUILD_PACKAGES=(g++ meson ninja-build pkg-config libtorch-dev libasio-dev liburing-dev
                       doctest-dev zlib1g-dev libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev
                       libwebp-dev libtiff-dev
                       libgloo-dev libcli11-dev nlohmann-json3-dev libxxhash-dev
                       libcurl4-openssl-dev
                       # the remote-shard tests serve shards with nginx on 127.0.0.1
                       nginx-light
                       # Meson compiles through ccache when it is installed: CI's four builds
                       # of one tree share most objects
                       ccache)

# Objects built with a precompiled header are cacheable only with this sloppiness: without it
# ccache refused 65% of the calls (every libtorch file) and a fresh machine's CI compiled
# everything four times (3951 s, stop 40).
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros}

# usage: ensure_build BUILD_DIR: sets BUILD_DIR up with tests, examples and benchmarks, unless it
# is set up already (as it is, whatever its options). One definition for tools/run and
# tools/test, which share ${COLOAD_BUILD:-build}: with one folder each, a fresh 2-core machine
# built coload twice (13m34s, then 9m51s more).
ensure_build() {
  [ -f "$1/build.ninja" ] || meson setup "$1" -Dtests=true -Dexamples=true -Dbench=true
}

# usage: meson_option BUILD NAME: prints build option NAME's value in the configured folder BUILD.
meson_option() {
  /usr/bin/python3 -c 'import json, sys
print(next(o["value"] for o in json.load(open(sys.argv[1])) if o["name"] == sys.argv[2]))' \
    "$1/meson-info/intro-buildoptions.json" "$2"
}
