"""The body of SEND_BATCH_MESSAGE: messages one after another, each as Java's
``MessageDecoder.encodeMessage`` writes it::

    totalSize i32 | magic i32 | bodyCRC i32 | flag i32 | bodyLen i32 + body | propertiesLen i16 + properties

Java and C++ clients write 0 for magic and body CRC, and brokers check neither (the store computes its own
CRC). The magic is read unsigned, as a stored record's magic is (a magic is a bit pattern, not a number),
so any 32-bit pattern round-trips.
"""

from __future__ import annotations

import struct
from typing import Final

from protocol.invariant import invariant

#: totalSize, magic, bodyCRC, flag, bodyLen
BATCH_HEAD: Final = struct.Struct(">iIiii")
invariant(BATCH_HEAD.size == 20, "a batch message's head must be 20 bytes")
#: propertiesLen, after the body
PROPERTIES_LENGTH: Final = struct.Struct(">h")
invariant(PROPERTIES_LENGTH.size == 2, "a batch message's properties length must be 2 bytes")
