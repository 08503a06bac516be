"""Access control compatible with RocketMQ 4.x plain ACL: accounts, per-topic and per-group permissions,
admin accounts, IP whitelists, HMAC-SHA1 request signatures; replicated through Raft so every member
enforces the same rules.

Modules (imported one by one): ``permissions`` (bits, admin codes), ``addresses`` (whitelist patterns),
``config`` (the file and the replicated document), ``resources`` (what a request needs),
``validator`` (the check), ``authorizer`` (the rules in force, the server hook), ``admission`` (the
server's pre-dispatch check: ACL and request limits), ``reloader`` (file watching, leader proposals).
Signing and verifying a request (what clients need too) is :mod:`protocol.signature`.
"""
