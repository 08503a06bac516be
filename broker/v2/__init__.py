"""RocketMQ 5.x clients: the gRPC protocol ``apache.rocketmq.v2`` served by every member, on the same
replicated log as the 4.x remoting protocol (no separate proxy).

- ``protocol/``: generated messages and stubs (``scripts/generate-grpc-v2.sh``; sources in ``proto/``).
- :mod:`broker.v2.status`: status codes, and the mapping of our operating errors onto them.
- :mod:`broker.v2.messages`: a 5.x message as the stored message a 4.x producer would have sent (pure).
- :mod:`broker.v2.auth`: the ``authorization`` header (MQv2-HMAC-SHA1) against the broker's ACL accounts.
- :mod:`broker.v2.clients`: the clients this member has heard of and the Settings it answers them with.
- :mod:`broker.v2.service`: the RPCs, each a typed request to a typed response.
- :mod:`broker.v2.server`: the grpc.aio shell (metadata, limits, forwarding to the leader).
"""
