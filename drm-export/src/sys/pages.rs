//! Whether the pages a new udmabuf pins are small pages, read from their page frames.
//!
//! On Linux 6.10 to 6.16 udmabuf's kernel mapping misplaces large folios (see
//! `crate::udmabuf::HUGE_PAGE_VMAP_BUG`), so a device that moves data through it must know.
//! The pages are looked at, never the settings that made them: the memfd's range is mapped
//! and every page touched *before* `UDMABUF_CREATE`, and the frames read from
//! `/proc/self/pagemap`; after the ioctl the same mapping is read again without touching it,
//! and every page must still be mapped at the same frame. A hole punched in between (which
//! `F_SEAL_SHRINK` does not prevent) unmaps the page, and a page faulted in again has another
//! frame, since the pinned one cannot be freed: then the answer is "unknown". Only frames that
//! were in the page cache both before and after the pin are judged, by `/proc/kpageflags`
//! (compound head or tail, hugetlb, THP). Frame numbers need `CAP_SYS_ADMIN`; without it the
//! answer is "unknown" too.

use super::Mmap;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;

const COMPOUND_HEAD: u64 = 1 << 15;
const COMPOUND_TAIL: u64 = 1 << 16;
const HUGE: u64 = 1 << 17;
const THP: u64 = 1 << 22;
const PRESENT: u64 = 1 << 63;
const FRAME: u64 = (1 << 55) - 1;

/// What was seen of a memfd's ranges before the pin.
pub(super) enum Before {
    /// A hugetlbfs memfd: large pages by definition.
    Huge,
    /// Each range mapped, with its pages' frames; the open pagemap and the page size, for
    /// the second look.
    Mapped {
        maps: Vec<(Mmap, Vec<u64>)>,
        pagemap: std::fs::File,
        page: usize,
    },
}

/// The CPU page size (4096 if `sysconf` cannot tell).
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64)
}

/// The frames of the `(offset, size)` ranges of `memfd`, each page touched first; `None` if
/// they cannot be read, or the memfd is not sealed against shrinking and long enough (then
/// `UDMABUF_CREATE` refuses it anyway).
pub(super) fn before(memfd: BorrowedFd<'_>, ranges: &[(u64, u64)]) -> Option<Before> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    let fs = nix::sys::statfs::fstatfs(memfd).ok()?;
    if fs.filesystem_type() == nix::sys::statfs::HUGETLBFS_MAGIC {
        return Some(Before::Huge);
    }
    let seals = SealFlag::from_bits_truncate(fcntl(memfd, FcntlArg::F_GET_SEALS).ok()?);
    let size = u64::try_from(nix::sys::stat::fstat(memfd).ok()?.st_size).ok()?;
    let page = usize::try_from(page_size()).ok()?;
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut out = Vec::with_capacity(ranges.len());
    for &(offset, len) in ranges {
        let end = offset.checked_add(len)?;
        if !seals.contains(SealFlag::F_SEAL_SHRINK) || end > size {
            return None;
        }
        let len = usize::try_from(len).ok()?;
        // SAFETY: the memfd carries F_SEAL_SHRINK (checked just above; a seal cannot be
        // removed) and is at least `end` bytes long, so it can never be shorter than the
        // mapping: no access through it faults.
        let map = unsafe { Mmap::shared(memfd, offset, len) }.ok()?;
        let bytes = map.volatile();
        let mut one = [0u8; 1];
        for at in (0..len).step_by(page) {
            vm_memory::VolatileMemory::get_slice(&bytes, at, 1)
                .ok()?
                .copy_to(&mut one[..]);
        }
        let frames = frames(&pagemap, &map, page)?;
        out.push((map, frames));
    }
    Some(Before::Mapped {
        maps: out,
        pagemap,
        page,
    })
}

/// After `UDMABUF_CREATE` succeeded on the ranges `before` saw: `Some(true)` if every page is
/// still mapped at the frame it had and none of them is part of a larger folio, `Some(false)`
/// if one is, `None` if that cannot be told.
pub(super) fn after(before: Option<Before>) -> Option<bool> {
    let (maps, pagemap, page) = match before? {
        Before::Huge => return Some(false),
        Before::Mapped {
            maps,
            pagemap,
            page,
        } => (maps, pagemap, page),
    };
    let kpageflags = std::fs::File::open("/proc/kpageflags").ok()?;
    let mut small = true;
    for (map, seen) in &maps {
        if frames(&pagemap, map, page)? != *seen {
            return None;
        }
        for &frame in seen {
            let mut flags = [0u8; 8];
            kpageflags.read_exact_at(&mut flags, frame * 8).ok()?;
            small &= u64::from_ne_bytes(flags) & (COMPOUND_HEAD | COMPOUND_TAIL | HUGE | THP) == 0;
        }
    }
    Some(small)
}

/// The frame of every page of `map` (without touching it); `None` if one is not mapped or
/// its frame is hidden (no `CAP_SYS_ADMIN`).
fn frames(pagemap: &std::fs::File, map: &Mmap, page: usize) -> Option<Vec<u64>> {
    let mut entries = vec![0u8; map.len().div_ceil(page) * 8];
    let at = u64::try_from(map.addr() / page).ok()?.checked_mul(8)?;
    pagemap.read_exact_at(&mut entries, at).ok()?;
    entries
        .chunks_exact(8)
        .map(|e| {
            let e = u64::from_ne_bytes(e.try_into().ok()?);
            let frame = e & FRAME;
            (e & PRESENT != 0 && frame != 0).then_some(frame)
        })
        .collect()
}
