"""High availability: nodes coordinated by etcd, one leader serving, followers replicating and proxying."""
