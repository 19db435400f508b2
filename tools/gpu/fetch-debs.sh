#!/usr/bin/env bash
# Run HERE (Debian 12, with apt): downloads the Debian packages that coload needs to build, as
# .deb files, into tools/gpu/debs (kept out of git), for tools/gpu/run.sh on a GPU machine that
# has no network and none of them. Not libtorch: that machine's PyTorch is used.
#
# usage: tools/gpu/fetch-debs.sh [DIR]      (DIR defaults to tools/gpu/debs)
#
# The list holds coload's build dependencies with what they need in turn, less what every
# Linux with a C++ compiler has (libc, libstdc++, libgcc, zlib's runtime, kernel headers).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tools/gpu/debs}
want=(libasio-dev liburing-dev doctest-dev zlib1g-dev libturbojpeg0-dev libjpeg62-turbo-dev
      libspng-dev pkgconf libxxhash-dev libcli11-dev nlohmann-json3-dev)
# Present on any build machine (the GPU machine's own versions are used).
base='^(libc6|libc6-dev|libc-dev|libc-dev-bin|linux-libc-dev|libgcc-s1|libstdc\+\+6|zlib1g|gcc-12-base|libcrypt1|libcrypt-dev|libnsl-dev|libtirpc-dev|rpcsvc-proto)$'

# The closure of Depends/PreDepends (first alternative of each), without the base.
declare -A seen=()
queue=("${want[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n ${seen[$p]:-} || $p =~ $base ]] && continue
  seen[$p]=1
  while read -r dep; do
    [[ -n $dep ]] && queue+=("$dep")
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$p" |
           awk '/^  (\|)?(Pre)?Depends:/ { if (!alt) print $2; alt = ($1 ~ /^\|/) } /^  [A-Z]/ && !/Depends/ {alt=0}' |
           tr -d '<>' | cut -d: -f1)
done
pkgs=("${!seen[@]}")

rm -rf "$out.partial"
mkdir -p "$out.partial"
(cd "$out.partial" && apt-get download -q "${pkgs[@]}" >/dev/null)
rm -rf "$out"
mv "$out.partial" "$out"
ls -1 "$out"
total=$(du -cb "$out"/*.deb | tail -n1 | cut -f1)
echo "$(ls "$out"/*.deb | wc -l) packages, $((total / 1024)) KiB in $out"
if [ "$total" -gt $((64 * 1024 * 1024)) ]; then
  echo "fetch-debs: more than 64 MiB" >&2
  exit 1
fi
