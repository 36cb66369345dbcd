"""``mooncake.engine`` over gpu_rdma (see :mod:`gpu_rdma.mooncake`)."""

from gpu_rdma.mooncake import TransferEngine, TransferNotify, TransferOpcode

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode"]
