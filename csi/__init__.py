"""The Kubernetes CSI driver (``fabric csi``): fabric volumes as PersistentVolumes.

Volumes in the style of the NFS CSI driver: a ``server`` (a hub or spoke URL, or a
list) and a ``share`` (``REPO@REF[/subdir]``). The controller (``controller.py``)
creates and deletes volumes for the external-provisioner; the node service
(``node.py``) mounts them at pods' target paths with mount processes that outlive the
driver (``mounts.py``, optionally through a long-lived mounter, ``mounter.py``).
The gRPC messages are loaded from ``csi.proto`` at start (``proto.py``).
"""
