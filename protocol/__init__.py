"""What both ends of a RocketMQ connection must agree on, shared by the broker and the client: the bottom
layer, importing nothing else of the project.

- remoting: :mod:`protocol.codes` (request and response codes), :mod:`protocol.command` (the
  ``RemotingCommand`` value), :mod:`protocol.limits`, :mod:`protocol.codec` (the sans-IO frame codec),
  :mod:`protocol.connection` (the asyncio connection both sides build on), :mod:`protocol.client`
  (``RemotingClient``) and :mod:`protocol.event_loop`;
- bodies: :mod:`protocol.route_data` (the name server's routes, topic configs and cluster info),
  :mod:`protocol.fastjson` (maps keyed by objects, as Java's tools read them);
- messages: :mod:`protocol.properties` (the properties codec and names), :mod:`protocol.batch` (a batch
  send's body), :mod:`protocol.topics` (topic names and rules), :mod:`protocol.subscription` (tag
  expressions);
- :mod:`protocol.signature` (ACL request signing) and :mod:`protocol.invariant` (programmer errors).

tests/test_layers.py keeps it so: nothing here imports the rest of the project, and the client imports
nothing of the broker.
"""
