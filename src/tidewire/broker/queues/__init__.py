"""Queues and exchanges (AMQP-style) over tidewire's logs: exchanges route published
messages through bindings into queues; each message is handed to one of a queue's competing
consumers, acknowledged one by one, redelivered, expired, delayed or dead-lettered."""
