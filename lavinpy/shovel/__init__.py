"""Dynamic shovels (RabbitMQ's ``shovel`` parameters): AMQP clients of two brokers moving messages.

definition: the parameter's keys, checked; client: the AMQP 0-9-1 client on lavinpy.wire; worker:
one shovel's loop; component: the node's shovels and the parameter component.
"""
