"""The driver of a cluster row: the one place that turns an ORM Cluster into a driver."""

import json
from pathlib import Path

from django.conf import settings

from ogai.crypto import DecryptionError, decrypt
from podsys.drivers import get_driver
from podsys.drivers.base import ClusterDriver, DriverError
from podsys.models import Cluster


def driver_for(cluster: Cluster) -> ClusterDriver:
    """The cluster's driver, with its stored credentials (a kubeconfig) merged into its options:
    they exist decrypted only in this process's memory."""
    options = dict(cluster.options)
    if cluster.driver == "kubernetes":
        # Finished pods' logs are kept here before their objects are deleted.
        options.setdefault("logs_dir", str(Path(settings.DATA_DIR) / "logs" / cluster.name))
    if cluster.credentials:
        try:
            options.update(json.loads(decrypt(cluster.credentials)))
        except DecryptionError as exc:
            raise DriverError(f"cluster {cluster.name}: {exc}") from None
    return get_driver(cluster=cluster.name, driver=cluster.driver, options=options)


def local_clusters() -> list[Cluster]:
    """The clusters whose work runs as processes of this machine (the local driver's)."""
    from podsys.drivers.local import LocalDriver

    found = []
    for cluster in Cluster.objects.order_by("pk"):
        try:
            if isinstance(driver_for(cluster), LocalDriver):
                found.append(cluster)
        except DriverError:
            continue  # a cluster whose driver cannot be made runs nothing here
    return found
