from tests.cluster._etcd import etcd

__all__ = ["etcd"]
