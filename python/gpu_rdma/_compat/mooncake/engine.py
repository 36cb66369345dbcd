"""``mooncake.engine`` over gpu_rdma (see :mod:`gpu_rdma.mooncake`)."""

from gpu_rdma.mooncake import TransferEngine, TransferNotify, TransferOpcode

# Mooncake's module exports the opcode's values too.
Read = TransferOpcode.Read
Write = TransferOpcode.Write

__all__ = ["Read", "TransferEngine", "TransferNotify", "TransferOpcode", "Write"]
