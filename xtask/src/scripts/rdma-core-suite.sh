# cargo xtask rdma-core-tests, in the VM: which libibverbs and rxe provider load, then
# rdma-core's Python suite; filled in by xtask/src/rdmacore.rs. Always exits 0: the outcome is
# what the suite prints.
cd /tmp && export LD_LIBRARY_PATH=@LIB_PATH@ &&
    LD_DEBUG=libs ibv_devices 2>&1 | sed -n 's/.*calling init: //p' | grep -E 'libibverbs|librxe'
PYTHONPATH=@PYTHONPATH@ /usr/bin/python3 @TESTS@/run_tests.py --dev "$RDMA_DEVICE" -v 2>&1
true
