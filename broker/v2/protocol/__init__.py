"""Generated code: the ``apache.rocketmq.v2`` messages and service stubs (``scripts/generate-grpc-v2.sh``
writes every other file here; do not edit them). Left out of ruff, and mypy ignores errors in them."""
