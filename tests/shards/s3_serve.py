#!/usr/bin/env python3
"""Serves a folder as an S3 bucket for the s3:// test: moto's server mode (PyPI's moto[server])
on 127.0.0.1 at an ephemeral port, bucket "coload" holding every file of ROOT under its path.
Requests are checked: the objects are put, and must be read, with SigV4 signatures made with
the access key of an IAM user made here. Prints "PORTS <port> <port> <key id> <secret>" once
the objects are in, or "SKIP <reason>" when moto cannot be
imported (here or in the virtual environment setup_moto.sh makes), and runs until its standard
input closes.

usage: s3_serve.py ROOT
"""
import json
import logging
import os
import socket
import sys

# moto checks each request's SigV4 signature against its IAM once this many actions are done:
# the three that make the user and its key go unsigned, the rest (and the test's) are checked.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"


def venv_python():
    venv = os.environ.get("COLOAD_MOTO_VENV",
                          os.path.expanduser("~/.cache/coload/venv-moto"))
    return venv, os.path.join(venv, "bin", "python")


# The virtual environment setup_moto.sh makes comes first where it exists, whatever this
# interpreter holds: its moto and boto3 were installed together (a moto 5.2.1 beside boto3
# 1.43, say, refuses boto3's own signatures of keys with '=' in them).
# A venv without moto (a broken setup) sends it back to the interpreter it came from.
venv, py = venv_python()
came_from = os.environ.pop("COLOAD_S3_SERVE_FROM", "")
if (not came_from and os.path.exists(py) and
        os.path.realpath(sys.prefix) != os.path.realpath(venv)):
    os.environ["COLOAD_S3_SERVE_FROM"] = sys.executable
    os.execv(py, [py, __file__] + sys.argv[1:])
try:
    import boto3
    from moto.server import ThreadedMotoServer
except ImportError:
    if came_from and came_from != "-":
        os.environ["COLOAD_S3_SERVE_FROM"] = "-"
        os.execv(came_from, [came_from, __file__] + sys.argv[1:])
    print("SKIP moto[server] is not installed (tests/shards/setup_moto.sh installs it from "
          "PyPI into " + venv + ")", flush=True)
    sys.exit(0)


def main(root):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boot = dict(endpoint_url=endpoint, region_name="us-east-1",
                    aws_access_key_id="boot", aws_secret_access_key="boot")
        iam = boto3.client("iam", **boot)
        iam.create_user(UserName="coload")
        iam.put_user_policy(UserName="coload", PolicyName="all", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="coload")["AccessKey"]
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=key["AccessKeyId"],
                          aws_secret_access_key=key["SecretAccessKey"])
        s3.create_bucket(Bucket="coload")
        for folder, _, files in os.walk(root):
            for f in files:
                path = os.path.join(folder, f)
                s3.upload_file(path, "coload", os.path.relpath(path, root))
        print(f"PORTS {port} {port} {key['AccessKeyId']} {key['SecretAccessKey']}", flush=True)
        while os.read(sys.stdin.fileno(), 4096):
            pass
    finally:
        server.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
