"""``mooncake`` over gpu_rdma: ``mooncake.engine.TransferEngine`` is
:class:`gpu_rdma.mooncake.TransferEngine`, and ``python -m mooncake.http_metadata_server``
runs gpu_rdma's server of Mooncake's HTTP metadata protocol.

Put this package's parent folder (``python -m gpu_rdma.mooncake path``) first on
``PYTHONPATH``. Where Mooncake's own package is installed too, its other modules stay
importable (this package's path is extended with theirs); ``engine`` and
``http_metadata_server`` are these. See docs/mooncake.md.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
