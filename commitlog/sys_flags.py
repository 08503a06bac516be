"""The bits of a stored record's sysFlag field (RocketMQ's MessageSysFlag): compression, several tags, the
transaction type, and which of the record's two hosts are IPv6 (:mod:`commitlog.record_codec` lays them out)."""

from __future__ import annotations

from typing import Final

SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
TRANSACTION_NOT_TYPE: Final = 0x0
TRANSACTION_PREPARED_TYPE: Final = 0x4
TRANSACTION_COMMIT_TYPE: Final = 0x8
TRANSACTION_ROLLBACK_TYPE: Final = 0xC
TRANSACTION_TYPE_MASK: Final = 0xC
SYSFLAG_BORNHOST_V6: Final = 0x10
SYSFLAG_STOREHOST_V6: Final = 0x20
