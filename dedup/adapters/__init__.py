"""Thin adapters of the framework-free call (dedup.deliveries) to web frameworks: each imports
its framework, so each needs its install extra (``cloud-scheduler-dedup[flask]``)."""
