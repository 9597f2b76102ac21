"""The driver of a cluster row: the one place that turns an ORM Cluster into a driver."""

from podsys.drivers import get_driver
from podsys.drivers.base import ClusterDriver
from podsys.models import Cluster


def driver_for(cluster: Cluster) -> ClusterDriver:
    return get_driver(cluster=cluster.name, driver=cluster.driver, options=cluster.options)
