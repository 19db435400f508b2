#!/bin/sh
# Makes the virtual environment the s3:// test runs moto's S3 server in (PyPI's moto[server]),
# at $COLOAD_MOTO_VENV or ~/.cache/coload/venv-moto. Where it cannot be made (no network, no
# venv module), the test skips, saying so.
set -u
venv="${COLOAD_MOTO_VENV:-$HOME/.cache/coload/venv-moto}"
"$venv/bin/python" -c "import boto3, moto.server" >/dev/null 2>&1 && exit 0
python3 -m venv "$venv" && "$venv/bin/pip" install --quiet --progress-bar off 'moto[server]' boto3 ||
  { echo "setup_moto: moto[server] did not install; the s3:// test will skip" >&2; exit 0; }
