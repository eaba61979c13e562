"""Typed messages, the msgpack codec and the error model."""

from castor.messages.base import Message, message_type, registered_types, type_name_of
from castor.messages.codec import decode, encode, from_wire, to_wire

__all__ = ["Message", "message_type", "registered_types", "type_name_of", "decode", "encode", "from_wire", "to_wire"]
