"""Federation (RabbitMQ's ``federation-upstream`` and ``federation-upstream-set`` parameters): exchange
links that pull what is published to an exchange of another broker into the local exchange of that name,
and queue links that feed a local queue's idle consumers from the upstream queue of that name.

upstream: the parameters' keys, checked; client: the small AMQP interface a link uses (over the
shovel's client, on lavinpy.wire); link: one exchange link's loop; queue_link: one queue link's loop;
component: the node's links and the parameter components.
"""
