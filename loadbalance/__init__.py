"""Pure core of the load balancer: model, wire formats and Pulsar's policies.

Nothing in this package does I/O, reads a clock or uses unseeded randomness: time arrives as a
``now_ms`` argument and randomness as a seeded ``random.Random``. Spark, Kafka and Redis code
in the shell packages (``streaming``, ``controller``, ``producers``, ``infra``, ``lbctl``) wires
these functions to the world. ``tests/unit/test_pure_core.py`` enforces it.
"""
