//! The raw layer: the one system call the crate makes that libc does not wrap safely.
#![allow(unsafe_code)]

use std::io;

/// `MPOL_F_NODE`: return the node instead of the policy.
const MPOL_F_NODE: libc::c_ulong = 1;
/// `MPOL_F_ADDR`: of the page at `addr`.
const MPOL_F_ADDR: libc::c_ulong = 2;

/// `get_mempolicy(&node, NULL, 0, addr, MPOL_F_NODE | MPOL_F_ADDR)`: the NUMA node of the
/// page at `addr` (the kernel faults it in for reading if it is not present yet).
pub fn page_node(addr: usize) -> io::Result<i32> {
    let mut node: libc::c_int = -1;
    // SAFETY: SYS_get_mempolicy writes one `int` through its first argument, `&mut node`, a
    // live out-pointer; the node mask is NULL with a length of 0, so nothing else is written;
    // `addr` is only looked up in the process's mappings by the kernel, never dereferenced
    // here (an unmapped one is EFAULT).
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr as *mut libc::c_void,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(node)
    }
}
