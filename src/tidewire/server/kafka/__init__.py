"""Kafka's wire protocol on a listener of its own (``kafka_port``): any Kafka client works
with tidewire. The codec is :mod:`tidewire.protocol.kafka`; this package holds the listener
and the handlers over the broker core (docs/kafka.md)."""
