"""Clusters, their nodes, devices and links: node registration and heartbeats, env-check reports, the topology, and
the pre-flight gate."""
