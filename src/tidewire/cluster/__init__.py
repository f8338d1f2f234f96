"""The cluster layer: metadata and leadership through etcd (see :mod:`tidewire.cluster.etcd`)."""
