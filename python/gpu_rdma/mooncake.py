"""Mooncake's ``TransferEngine`` over gpu_rdma: the same methods, arguments and return codes.

SGLang's and vLLM's Mooncake connectors call ``mooncake.engine.TransferEngine``; with the
folder that :func:`compat_path` names first on ``PYTHONPATH`` that import finds this class
(``python -m gpu_rdma.mooncake path`` prints the folder). See docs/mooncake.md.

Return conventions are Mooncake's: 0 on success and a negative code on failure; an
asynchronous submit returns a batch id, 0 on failure; an address of 0 means none. Behind a
negative code, :meth:`TransferEngine.last_error` gives the typed error (a
:class:`gpu_rdma.Error` with ``kind``, ``operation``, ``hint``). A transfer waits at most
``MC_TRANSFER_TIMEOUT`` seconds (30 by default) plus one second per GiB.

Memory registered by address (``register_memory``) is the caller's, as in Mooncake: it
must stay allocated until it is unregistered, and what the CPU does with it while a
transfer runs is the caller's to order. Managed buffers (``allocate_managed_buffer``) are
the engine's.
"""

from __future__ import annotations

import ctypes
import enum
import json
import mmap
import os
import re
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ._native import Agent, Batch, Error, Transfer

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode", "compat_path"]

#: What Mooncake's metadata string names when peers find each other by address alone.
P2PHANDSHAKE = "P2PHANDSHAKE"

#: Mooncake's error codes that a caller may tell apart (Mooncake's ``error.h``).
ERR_INVALID_ARGUMENT = -1
ERR_ADDRESS_NOT_REGISTERED = -101
ERR_METADATA = -400
ERR_TRANSFER = -500
ERR_TIMEOUT = -502


class TransferOpcode(enum.IntEnum):
    """Which way a transfer moves bytes (Mooncake's values)."""

    Read = 0
    Write = 1


class TransferNotify:
    """A notification: the peer's ``name`` and its ``msg``."""

    def __init__(self, name: str = "", msg: str = "") -> None:
        self.name = name
        self.msg = msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


def compat_path() -> str:
    """The folder holding the ``mooncake`` package over this module: put it first on
    ``PYTHONPATH`` and ``from mooncake.engine import TransferEngine`` gets this class."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_compat")


def _timeout(total_bytes: int) -> float:
    """Mooncake's bound on a synchronous transfer: MC_TRANSFER_TIMEOUT whole seconds (30 when
    unset, at least 5, as Mooncake reads it) + 1 s per GiB. A value that is not a whole
    number is refused (InvalidInput), never taken for unset."""
    text = os.environ.get("MC_TRANSFER_TIMEOUT", "30")
    try:
        base = max(5, int(text))
    except ValueError:
        raise _invalid(
            "transfer", f"MC_TRANSFER_TIMEOUT={text!r}: a whole number of seconds"
        ) from None
    return min(base + total_bytes / float(1 << 30), 1e9)


def _u64(x: object) -> bool:
    """Whether ``x`` is an int in [0, 2^64) (no bool, no float)."""
    return type(x) is int and 0 <= x < 1 << 64


def _code(e: Error) -> int:
    """Mooncake's negative code for a gpu_rdma error."""
    if e.kind == "NotFound":
        # The engine's NoSegmentAt, whose text starts so (its format is the engine's own).
        unregistered = re.match(r"entry \d+: no segment of agent ", str(e)) is not None
        return ERR_ADDRESS_NOT_REGISTERED if unregistered else ERR_METADATA
    if e.kind in ("Unavailable", "Incompatible", "Unauthenticated"):
        return ERR_METADATA
    if e.kind == "TimedOut":
        return ERR_TIMEOUT
    if e.kind == "InvalidInput":
        return ERR_INVALID_ARGUMENT
    return ERR_TRANSFER


class _Managed:
    """A managed buffer: an anonymous mapping and the ctypes view that names its address."""

    def __init__(self, length: int) -> None:
        self.map = mmap.mmap(-1, length)
        self.view = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(self.view)

    def close(self) -> None:
        del self.view
        self.map.close()


class TransferEngine:
    """Mooncake's ``TransferEngine`` (its Python binding's methods) over a gpu_rdma agent."""

    TransferOpcode = TransferOpcode

    def __init__(self) -> None:
        self._agent: Optional[Agent] = None
        self._p2p = False
        self._name = ""
        self._lock = threading.Lock()
        # address -> (segment name, length, managed buffer or None, host memory); a name of
        # "" while its registration is under way
        self._buffers: Dict[int, Tuple[str, int, Optional[_Managed], bool]] = {}
        self._sessions: Dict[str, str] = {}
        # batch id -> (transfer, its bound in seconds, when it was submitted)
        self._batches: Dict[int, Tuple[Transfer, float, float]] = {}
        self._next_batch = 1
        self._next_segment = 0
        self._last_error: Optional[Error] = None

    # --- errors --------------------------------------------------------------------------

    def last_error(self) -> Optional[Error]:
        """The error behind the last negative code (or 0 address) of this engine, typed:
        ``kind``, ``operation``, ``hint`` and its message; None after a success."""
        return self._last_error

    def _fail(self, e: Error, code: Optional[int] = None) -> int:
        self._last_error = e
        # Set (to anything but "" or "0"): quiet.
        if os.environ.get("GPU_RDMA_MOONCAKE_QUIET", "") in ("", "0"):
            print(f"gpu_rdma.mooncake: {e}", file=sys.stderr)
        return _code(e) if code is None else code

    def _refuse(self, op: str, why: str, code: int = ERR_INVALID_ARGUMENT) -> int:
        return self._fail(_invalid(op, why), code)

    def _engine(self, op: str) -> Agent:
        if self._agent is None:
            raise _invalid(op, "the engine is not initialized (call initialize first)")
        return self._agent

    # --- set-up --------------------------------------------------------------------------

    def initialize(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str
    ) -> int:
        """Starts the engine as ``local_hostname`` (``host`` or ``host:port``: the port is
        the control port, else any), with peers found through ``metadata_server``
        (``"P2PHANDSHAKE"``: by address; ``http://host:port/metadata``: an HTTP metadata
        server; ``etcd://host:port`` or ``host:port``: etcd), over RDMA devices
        ``device_name`` (comma-separated; empty: every active one). ``protocol`` must be
        ``"rdma"``. 0 on success."""
        if "://" in metadata_server:
            kind, _, rest = metadata_server.partition("://")
        elif metadata_server == P2PHANDSHAKE:
            kind, rest = "", metadata_server
        else:
            kind, rest = "etcd", metadata_server
        return self.initialize_ext(local_hostname, rest, protocol, device_name, kind)

    def initialize_ext(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str,
        device_name: str,
        metadata_type: str,
    ) -> int:
        """As :meth:`initialize`, the metadata service's type given apart
        (``"http"``, ``"etcd"``, or ``""`` with ``"P2PHANDSHAKE"``)."""
        op = "initialize"
        if self._agent is not None:
            return self._refuse(op, "already initialized")
        if protocol != "rdma":
            return self._refuse(
                op,
                f"protocol {protocol!r}: gpu_rdma moves bytes over RDMA only (PROTOCOL=rdma)",
            )
        host, sep, port = local_hostname.rpartition(":")
        if not sep or not port.isdigit():
            host, port = local_hostname, "0"
        kwargs: Dict[str, object] = {}
        if metadata_server == P2PHANDSHAKE:
            self._p2p = True
        elif metadata_type == "http":
            kwargs["metadata_server"] = "http://" + metadata_server
        elif metadata_type == "etcd":
            kwargs["etcd"] = ["http://" + e for e in metadata_server.split(",")]
        else:
            return self._refuse(op, f"metadata service {metadata_type}://{metadata_server}")
        devices = [d.split(":")[0] for d in device_name.split(",") if d] or None
        try:
            bind = f"{_ip(host or '0.0.0.0')}:{port}"
            self._agent = Agent(local_hostname, devices=devices, bind=bind, **kwargs)  # type: ignore[arg-type]
        except Error as e:
            return self._fail(e, -1)
        except OSError as e:
            return self._fail(_invalid(op, f"local hostname {local_hostname!r}: {e}"), -1)
        self._name = local_hostname
        self._last_error = None
        return 0

    def get_rpc_port(self) -> int:
        """The control port peers reach this engine at (the P2P session's port)."""
        if self._agent is None:
            return -1
        return int(self._agent.address.rpartition(":")[2])

    def get_engine(self) -> Optional[Agent]:
        """The gpu_rdma agent underneath (None before :meth:`initialize`)."""
        return self._agent

    def get_engine_ptr(self) -> int:
        """An identifier of the engine underneath (Mooncake gives its C++ pointer)."""
        return 0 if self._agent is None else id(self._agent)

    def get_local_topology(self, device_name: Optional[str] = None) -> str:
        """The RDMA devices in use, as JSON."""
        devices = [] if self._agent is None else self._agent.devices
        if device_name:
            devices = [d for d in devices if d in device_name.split(",")]
        return json.dumps({"devices": devices})

    # --- memory --------------------------------------------------------------------------

    def _register(self, addr: int, length: int, location: str, managed: Optional[_Managed]) -> int:
        op = "register_memory"
        try:
            agent = self._engine(op)
            if not (_u64(addr) and _u64(length)) or addr == 0 or length == 0:
                raise _invalid(op, f"{length!r} bytes at {addr!r}")
            if addr + length > 1 << 64:
                raise _invalid(op, f"{length} bytes at {addr:#x} wrap the address space")
            if not isinstance(location, str):
                raise _invalid(op, f"location {location!r}")
            with self._lock:
                if addr in self._buffers:
                    raise _invalid(op, f"{addr:#x} is already registered")
                name = f"mc{self._next_segment:012d}"
                self._next_segment += 1
                self._buffers[addr] = ("", length, managed, False)  # reserved
            try:
                found = agent.register_address(name, addr, length, location, managed)
            except Error:
                with self._lock:
                    del self._buffers[addr]
                raise
            with self._lock:
                self._buffers[addr] = (name, length, managed, found == "cpu")
        except Error as e:
            return self._fail(e, -1)
        self._last_error = None
        return 0

    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int:
        """Registers ``capacity`` bytes at ``buffer_addr`` (host memory, or CUDA memory the
        driver knows): the caller keeps it allocated until :meth:`unregister_memory`."""
        return self._register(buffer_addr, capacity, location, None)

    def unregister_memory(self, buffer_addr: int) -> int:
        """Unregisters what :meth:`register_memory` registered at ``buffer_addr``."""
        op = "unregister_memory"
        with self._lock:
            held = self._buffers.get(buffer_addr)
        if held is None or not held[0] or self._agent is None:
            return self._refuse(op, f"nothing registered at {buffer_addr!r}", -1)
        try:
            self._agent.unregister(held[0])
        except Error as e:
            return self._fail(e, -1)
        with self._lock:
            del self._buffers[buffer_addr]
        self._last_error = None
        return 0

    def batch_register_memory(
        self, buffer_addresses: Sequence[int], capacities: Sequence[int], location: str = "*"
    ) -> int:
        """Registers each range; stops at the first failure (its code), 0 if all are."""
        if len(buffer_addresses) != len(capacities):
            return self._refuse("batch_register_memory", "lists of different lengths")
        done: List[int] = []
        for a, c in zip(buffer_addresses, capacities):
            rc = self.register_memory(a, c, location)
            if rc != 0:
                # All or none: those registered already go again.
                for d in done:
                    self.unregister_memory(d)
                return rc
            done.append(a)
        return 0

    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int:
        """Unregisters each; the last failure's code, 0 if all were."""
        rc = 0
        for a in buffer_addresses:
            rc = self.unregister_memory(a) or rc
        return rc

    def allocate_managed_buffer(self, length: int) -> int:
        """Allocates and registers ``length`` bytes of host memory; its address, 0 on
        failure."""
        if not _u64(length) or length == 0 or length >= 1 << 63:
            self._refuse("allocate_managed_buffer", f"{length!r} bytes")
            return 0
        try:
            m = _Managed(length)
        except (OSError, ValueError, OverflowError) as e:
            self._refuse("allocate_managed_buffer", str(e))
            return 0
        if self._register(m.address, length, "cpu", m) != 0:
            m.close()
            return 0
        return m.address

    def free_managed_buffer(self, buffer_addr: int, length: int) -> int:
        """Unregisters and frees a buffer of :meth:`allocate_managed_buffer`."""
        with self._lock:
            held = self._buffers.get(buffer_addr)
        if held is None or held[2] is None:
            return self._refuse("free_managed_buffer", f"no managed buffer at {buffer_addr!r}", -1)
        rc = self.unregister_memory(buffer_addr)
        if rc == 0:
            held[2].close()
        return rc

    def _host_range(self, addr: object, length: object) -> bool:
        """Whether ``[addr, addr + length)`` lies in host memory registered with this engine
        (call with the lock held)."""
        if not (_u64(addr) and _u64(length)):
            return False
        assert isinstance(addr, int) and isinstance(length, int)
        return any(
            host and name and a <= addr and addr + length <= a + n
            for a, (name, n, _, host) in self._buffers.items()
        )

    def write_bytes_to_buffer(self, dest_address: int, src: object, length: int) -> int:
        """Copies the first ``length`` bytes of ``src`` (bytes-like, or a ``str`` as UTF-8)
        to ``dest_address``, which must lie in host memory registered with this engine; -1
        otherwise, nothing written. The copy holds the engine's lock, so the memory cannot
        be unregistered or freed under it."""
        op = "write_bytes_to_buffer"
        try:
            data = memoryview(src.encode() if isinstance(src, str) else src).cast("B")  # type: ignore[arg-type]
        except (TypeError, ValueError) as e:
            return self._refuse(op, f"source: {e}", -1)
        if not _u64(length) or length > data.nbytes:
            return self._refuse(op, f"{length!r} bytes of a {data.nbytes}-byte source", -1)
        with self._lock:
            if not self._host_range(dest_address, length):
                return self._refuse(
                    op, f"{length} bytes at {dest_address!r}: not in registered host memory", -1
                )
            ctypes.memmove(dest_address, bytes(data[:length]), length)
        return 0

    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes:
        """The ``length`` bytes at ``source_address``, which must lie in host memory
        registered with this engine (empty bytes otherwise)."""
        with self._lock:
            if not self._host_range(source_address, length):
                self._refuse(
                    "read_bytes_from_buffer",
                    f"{length!r} bytes at {source_address!r}: not in registered host memory",
                )
                return b""
            return ctypes.string_at(source_address, length)

    # --- peers ---------------------------------------------------------------------------

    def _own(self, session: str) -> bool:
        """Whether ``session`` names this engine: its name, or under P2P its address."""
        if session == self._name:
            return True
        host = self._name.rpartition(":")[0] or self._name
        return self._p2p and session == f"{host}:{self.get_rpc_port()}"

    def _peer(self, session: str) -> str:
        """The agent name of ``session``: itself under a metadata service; under P2P the
        agent found at that address (asked once)."""
        agent = self._engine("open segment")
        if self._own(session):
            return self._name
        if not self._p2p:
            return session
        with self._lock:
            known = self._sessions.get(session)
        if known is not None:
            return known
        host, sep, port = session.rpartition(":")
        if not sep or not port.isdigit():
            raise _invalid("open segment", f"session {session!r}: host:port under P2PHANDSHAKE")
        try:
            addr = f"{_ip(host)}:{port}"
        except OSError as e:
            raise _invalid("open segment", f"session {session!r}: {e}") from None
        name = agent.add_peer_at(addr)
        with self._lock:
            self._sessions[session] = name
        return name

    def get_first_buffer_address(self, segment_name: str) -> int:
        """The address of the first buffer ``segment_name`` registered (this engine's own
        name, or a peer's session), 0 if none."""
        try:
            agent = self._engine("get_first_buffer_address")
            own = self._own(segment_name)
            table = agent.describe(None if own else self._peer(segment_name))
        except Error as e:
            self._fail(e)
            return 0
        bases = [b for (_, b, _) in table if b is not None]
        return bases[0] if bases else 0

    def send_probe(self, peer_server_name: str) -> int:
        """0 if the peer answers (its descriptor is fetched), a negative code otherwise."""
        try:
            peer = self._peer(peer_server_name)
            self._engine("send_probe").describe(peer)
        except Error as e:
            return self._fail(e, ERR_METADATA)
        self._last_error = None
        return 0

    def get_notifies(self) -> List[TransferNotify]:
        """The notifications received so far (taken)."""
        out: List[TransferNotify] = []
        if self._agent is None:
            return out
        while True:
            n = self._agent.wait_notification(0.0)
            if n is None:
                return out
            out.append(TransferNotify(n.sender, n.message.decode("utf-8", "replace")))

    # --- transfers -----------------------------------------------------------------------

    def _submit(
        self,
        op: str,
        target: str,
        buffers: Sequence[int],
        peer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: int,
        notify: Optional[TransferNotify] = None,
    ) -> Tuple[Transfer, float, float]:
        if not (len(buffers) == len(peer_addresses) == len(lengths)) or not buffers:
            raise _invalid(op, "buffers, peer addresses and lengths: lists of one length, not empty")
        if type(opcode) is not TransferOpcode and opcode not in (0, 1):
            raise _invalid(op, f"opcode {opcode!r}: TransferOpcode.Read or TransferOpcode.Write")
        agent = self._engine(op)
        peer = self._peer(target)
        batch = Batch()
        add = batch.write_at if opcode == TransferOpcode.Write else batch.read_at
        total = 0
        for b, p, n in zip(buffers, peer_addresses, lengths):
            if not (_u64(b) and _u64(p) and _u64(n)) or b + n > 1 << 64 or p + n > 1 << 64:
                raise _invalid(op, f"{n!r} bytes at {b!r} -> {p!r}: outside the address space")
            add(b, peer, p, n)
            total += n
        if notify is not None:
            batch.notify(notify.msg.encode())
        bound = _timeout(total)  # before submitting: a bad bound moves nothing
        return agent.transfer(batch), bound, time.monotonic()

    def _sync(
        self,
        op: str,
        target: str,
        buffers: Sequence[int],
        peer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: int,
        notify: Optional[TransferNotify] = None,
    ) -> int:
        try:
            t, bound, _ = self._submit(op, target, buffers, peer_addresses, lengths, opcode, notify)
            t.wait(bound)
        except Error as e:
            return self._fail(e)
        self._last_error = None
        return 0

    def _async(
        self,
        op: str,
        target: str,
        buffers: Sequence[int],
        peer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: int,
    ) -> int:
        try:
            submitted = self._submit(op, target, buffers, peer_addresses, lengths, opcode)
        except Error as e:
            self._fail(e)
            return 0
        with self._lock:
            bid = self._next_batch
            self._next_batch += 1
            self._batches[bid] = submitted
        self._last_error = None
        return bid

    def transfer_sync_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
        transport_hint: str = "",
    ) -> int:
        """Writes ``length`` bytes at ``buffer`` to the peer's ``peer_buffer_address``."""
        return self._sync("transfer_sync_write", target_hostname, [buffer],
                          [peer_buffer_address], [length], TransferOpcode.Write)

    def transfer_sync_read(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
        transport_hint: str = "",
    ) -> int:
        """Reads ``length`` bytes at the peer's ``peer_buffer_address`` into ``buffer``."""
        return self._sync("transfer_sync_read", target_hostname, [buffer],
                          [peer_buffer_address], [length], TransferOpcode.Read)

    def transfer_sync(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
        opcode: int, notify: Optional[TransferNotify] = None, transport_hint: str = "",
    ) -> int:
        """A write or read (``opcode``), with an optional notification once it landed."""
        return self._sync("transfer_sync", target_hostname, [buffer], [peer_buffer_address],
                          [length], opcode, notify)

    def batch_transfer_sync_write(
        self, target_hostname: str, buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """Writes every range, in one batch; 0 once all landed."""
        return self._sync("batch_transfer_sync_write", target_hostname, buffers,
                          peer_buffer_addresses, lengths, TransferOpcode.Write)

    def batch_transfer_sync_read(
        self, target_hostname: str, buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """Reads every range, in one batch; 0 once all landed."""
        return self._sync("batch_transfer_sync_read", target_hostname, buffers,
                          peer_buffer_addresses, lengths, TransferOpcode.Read)

    def batch_transfer_sync(
        self, target_hostname: str, buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int], lengths: Sequence[int], opcode: int,
        notify: Optional[TransferNotify] = None, transport_hint: str = "",
    ) -> int:
        """Writes or reads every range, with an optional notification."""
        return self._sync("batch_transfer_sync", target_hostname, buffers,
                          peer_buffer_addresses, lengths, opcode, notify)

    def batch_transfer_async_write(
        self, target_hostname: str, buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """Submits the writes; a batch id for :meth:`get_batch_transfer_status`, 0 on
        failure."""
        return self._async("batch_transfer_async_write", target_hostname, buffers,
                           peer_buffer_addresses, lengths, TransferOpcode.Write)

    def batch_transfer_async_read(
        self, target_hostname: str, buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int], lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """Submits the reads; a batch id, 0 on failure."""
        return self._async("batch_transfer_async_read", target_hostname, buffers,
                           peer_buffer_addresses, lengths, TransferOpcode.Read)

    def batch_transfer_async(
        self, target_hostname: str, buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int], lengths: Sequence[int], opcode: int,
        transport_hint: str = "",
    ) -> int:
        """Submits writes or reads (``opcode``); a batch id, 0 on failure."""
        return self._async("batch_transfer_async", target_hostname, buffers,
                           peer_buffer_addresses, lengths, opcode)

    def transfer_submit_write(
        self, target_hostname: str, buffer: int, peer_buffer_address: int, length: int,
        transport_hint: str = "",
    ) -> int:
        """Submits one write; a batch id for :meth:`transfer_check_status`, 0 on failure."""
        return self._async("transfer_submit_write", target_hostname, [buffer],
                           [peer_buffer_address], [length], TransferOpcode.Write)

    def _take(self, batch_id: int) -> Optional[Tuple[Transfer, float, float]]:
        with self._lock:
            return self._batches.get(batch_id)

    def _forget(self, batch_id: int) -> None:
        with self._lock:
            self._batches.pop(batch_id, None)

    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Waits for every batch (each bounded as a synchronous transfer is); 0 if all
        succeeded, the first failure's code otherwise. Each id is spent."""
        rc = 0
        for bid in dict.fromkeys(batch_ids):
            held = self._take(bid)
            if held is None:
                rc = rc or self._refuse("get_batch_transfer_status", f"unknown batch id {bid}")
                continue
            try:
                left = held[1] - (time.monotonic() - held[2])
                held[0].wait(max(left, 0.0))
            except Error as e:
                rc = rc or self._fail(e)
            self._forget(bid)
        if rc == 0:
            self._last_error = None
        return rc

    def transfer_check_status(self, batch_id: int) -> int:
        """Mooncake's poll: 1 done (the id is spent), 0 still running, -1 failed (spent),
        -2 past its time bound."""
        held = self._take(batch_id)
        if held is None:
            return self._refuse("transfer_check_status", f"unknown batch id {batch_id}", -1)
        t = held[0]
        if not t.done:
            return -2 if time.monotonic() - held[2] > held[1] else 0
        self._forget(batch_id)
        try:
            t.wait(0.0)
        except Error as e:
            return self._fail(e, -2 if e.kind == "TimedOut" else -1)
        return 1


def _ip(host: str) -> str:
    """``host`` as an IPv4 address (a name is resolved)."""
    return socket.gethostbyname(host)


def _invalid(op: str, why: str) -> Error:
    """A typed InvalidInput for a refusal of this module (as the engine raises them)."""
    from ._errors import InvalidInput

    return InvalidInput(f"{op}: {why}", operation=op)


def main(argv: Sequence[str]) -> int:
    """``python -m gpu_rdma.mooncake path``: prints :func:`compat_path`."""
    if list(argv) == ["path"]:
        print(compat_path())
        return 0
    print("usage: python -m gpu_rdma.mooncake path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
