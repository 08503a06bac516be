#!/bin/sh
# Regenerate broker/v2/protocol/ (the apache.rocketmq.v2 messages and service stubs) from the .proto files in
# broker/v2/proto/ (copied unchanged from npm rocketmq-client-nodejs@1.0.8, proto/apache/rocketmq/v2/).
# `make grpc-v2` runs it with the venv's grpcio-tools; the output is committed, so nobody else needs protoc.
#
# protoc writes absolute imports (`from apache.rocketmq.v2 import definition_pb2`): they are made relative so
# the modules live inside our package. The descriptors keep their names (apache/rocketmq/v2/*.proto), which
# is why a process must not import both these modules and the Python SDK's copies of them.
set -eu
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
out=broker/v2/protocol
rm -f "$out"/*_pb2.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.py
"$python" -m grpc_tools.protoc -I broker/v2/proto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    broker/v2/proto/apache/rocketmq/v2/definition.proto broker/v2/proto/apache/rocketmq/v2/service.proto \
    broker/v2/proto/apache/rocketmq/v2/admin.proto
# protoc follows the proto package into apache/rocketmq/v2/: flatten it into our package
mv "$out"/apache/rocketmq/v2/* "$out"/
rm -rf "$out"/apache
rm -f "$out"/definition_pb2_grpc.py  # definition.proto declares no service
sed -i 's/^from apache\.rocketmq\.v2 import /from . import /' "$out"/*_pb2.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.py
