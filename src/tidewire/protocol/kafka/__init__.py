"""Kafka's wire protocol, sans I/O: the codec the Kafka listener speaks (docs/kafka.md).

Request and response schemas are data (:mod:`._schemas`, written from Kafka's own message
definitions by scripts/kafka-schemas); bodies are plain dicts with snake_case field names;
flexible versions (compact types, tagged fields) come from the schemas.
"""

from tidewire.protocol.kafka.codec import (
    RequestHeader,
    decode_header,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    encode_response_parts,
)
from tidewire.protocol.kafka.errors import ErrorCode, KafkaCodecError
from tidewire.protocol.kafka.versions import SUPPORTED, ApiKey

__all__ = [
    "SUPPORTED",
    "ApiKey",
    "ErrorCode",
    "KafkaCodecError",
    "RequestHeader",
    "decode_header",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "encode_response_parts",
]
