"""The panel queries of RabbitMQ's "RabbitMQ-Overview" Grafana dashboard, as query strings.

Copied from rabbitmq-server's deps/rabbitmq_prometheus/docker/grafana/dashboards/RabbitMQ-Overview.json
(one entry per panel: its title and its targets' expressions, Grafana variables left in place);
tests/e2e/test_prometheus_dashboards.py fills the variables and has a real Prometheus evaluate them.
"""
# ruff: noqa: E501

from __future__ import annotations

OVERVIEW_PANELS: list[tuple[str, list[str]]] = [
    ('Ready messages', [
        'sum(rabbitmq_queue_messages_ready * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Outgoing messages / s', [
        'sum(irate(rabbitmq_global_messages_delivered_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Publishers', [
        'sum(rabbitmq_global_publishers * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Connections', [
        'sum(rabbitmq_connections * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Queues', [
        'sum(rabbitmq_queues * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Unacknowledged messages', [
        'sum(rabbitmq_queue_messages_unacked * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Incoming messages / s', [
        'sum(irate(rabbitmq_global_messages_received_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Consumers', [
        'sum(rabbitmq_global_consumers * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Channels', [
        'sum(rabbitmq_channels * on(instance, job) group_left(rabbitmq_cluster) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Nodes', [
        'count(rabbitmq_identity_info{namespace="$namespace",rabbitmq_cluster="$rabbitmq_cluster",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Nodes table', [
        'rabbitmq_erlang_uptime_seconds *on(instance,job) group_left(rabbitmq_version, erlang_version) rabbitmq_build_info * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{namespace="$namespace", rabbitmq_cluster="$rabbitmq_cluster", rabbitmq_endpoint="$endpoint"}',
    ]),
    ('Memory available before publishers blocked', [
        '(rabbitmq_resident_memory_limit_bytes * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) -\n(rabbitmq_process_resident_memory_bytes * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Disk space available before publishers blocked', [
        '(rabbitmq_disk_space_available_bytes - rabbitmq_disk_space_available_limit_bytes) * on(instance,job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster",namespace="$namespace", rabbitmq_endpoint="$endpoint"}',
    ]),
    ('File descriptors available', [
        '(rabbitmq_process_max_fds - rabbitmq_process_open_fds) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}',
    ]),
    ('Messages ready to be delivered to consumers', [
        'sum(rabbitmq_queue_messages_ready * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Messages pending consumer acknowledgement', [
        'sum(rabbitmq_queue_messages_unacked * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Messages published / s', [
        'sum(rate(rabbitmq_global_messages_received_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Avg Size', [
        'sum (increase(rabbitmq_message_size_bytes_sum[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) / sum (increase(rabbitmq_message_size_bytes_count[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Message Size Distribution', [
        'sum(increase(rabbitmq_message_size_bytes_bucket{le="100.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="1000.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="100.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="10000.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="1000.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="100000.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="10000.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="1e+06"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="100000.0"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="1e+07"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="1e+06"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="5e+07"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="1e+07"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="1e+08"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="5e+07"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
        '(sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) - sum(increase(rabbitmq_message_size_bytes_bucket{le="1e+08"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})) / sum(increase(rabbitmq_message_size_bytes_bucket{le="+Inf"}[$__range]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})',
    ]),
    ('Messages routed to queues / s', [
        'sum(rate(rabbitmq_global_messages_routed_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Messages confirmed to publishers / s', [
        'sum(rate(rabbitmq_global_messages_confirmed_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Unroutable messages dropped & returned / s', [
        'sum(rate(rabbitmq_global_messages_unroutable_dropped_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
        'sum(rate(rabbitmq_global_messages_unroutable_returned_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Messages unconfirmed to publishers / s', [
        'sum(rate(rabbitmq_global_messages_received_confirm_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"} - \nrate(rabbitmq_global_messages_confirmed_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}\n) by(rabbitmq_node)',
    ]),
    ('Messages delivered / s', [
        'sum(\n  (rate(rabbitmq_global_messages_delivered_consume_auto_ack_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) +\n  (rate(rabbitmq_global_messages_delivered_consume_manual_ack_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"})\n) by(rabbitmq_node)',
    ]),
    ('Messages redelivered / s', [
        'sum(rate(rabbitmq_global_messages_redelivered_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Messages delivered with manual ack / s', [
        'sum(rate(rabbitmq_global_messages_delivered_consume_manual_ack_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Messages delivered auto ack / s', [
        'sum(rate(rabbitmq_global_messages_delivered_consume_auto_ack_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Messages acknowledged / s', [
        'sum(rate(rabbitmq_global_messages_acknowledged_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Polling operations with auto ack / s', [
        'sum(rate(rabbitmq_global_messages_delivered_get_auto_ack_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Polling operations that yield no result / s', [
        'sum(rate(rabbitmq_global_messages_get_empty_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Polling operations with manual ack / s', [
        'sum(rate(rabbitmq_global_messages_delivered_get_manual_ack_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace",rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Total queues', [
        'rabbitmq_queues * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}',
    ]),
    ('Queues declared / s', [
        'sum(rate(rabbitmq_queues_declared_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Queues created / s', [
        'sum(rate(rabbitmq_queues_created_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Queues deleted / s', [
        'sum(rate(rabbitmq_queues_deleted_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Total channels', [
        'rabbitmq_channels * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}',
    ]),
    ('Channels opened / s', [
        'sum(rate(rabbitmq_channels_opened_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Channels closed / s', [
        'sum(rate(rabbitmq_channels_closed_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Total connections', [
        'rabbitmq_connections * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}',
    ]),
    ('Connections opened / s', [
        'sum(rate(rabbitmq_connections_opened_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
    ('Connections closed / s', [
        'sum(rate(rabbitmq_connections_closed_total[$__rate_interval]) * on(instance, job) group_left(rabbitmq_cluster, rabbitmq_node) rabbitmq_identity_info{rabbitmq_cluster="$rabbitmq_cluster", namespace="$namespace", rabbitmq_endpoint="$endpoint"}) by(rabbitmq_node)',
    ]),
]
