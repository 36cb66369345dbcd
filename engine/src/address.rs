//! Entries that name memory by address ([`Batch::write_at`](crate::Batch::write_at)):
//! resolved to a segment and an offset against the segments' base addresses, before the
//! batch is planned.

use crate::batch::{Entry, Op, BY_ADDRESS};
use crate::descriptor::{AgentDescriptor, SegmentDescriptor};
use crate::error::{Error, Result, Side};
use std::borrow::Cow;
use std::collections::HashMap;

/// Segments with a base address, sorted by it, for look-ups by address; with, for each
/// position, the segment of the furthest end among those up to it.
struct Bases<'a> {
    sorted: Vec<(u64, &'a SegmentDescriptor)>,
    furthest: Vec<usize>,
}

impl<'a> Bases<'a> {
    fn new(segments: impl Iterator<Item = &'a SegmentDescriptor>) -> Bases<'a> {
        let mut sorted: Vec<_> = segments.filter_map(|s| Some((s.base?, s))).collect();
        sorted.sort_unstable_by_key(|&(b, _)| b);
        let end = |s: &SegmentDescriptor| s.base.map_or(0, |b| b.saturating_add(s.len));
        let mut furthest: Vec<usize> = Vec::with_capacity(sorted.len());
        for (i, &(_, s)) in sorted.iter().enumerate() {
            let best = match furthest.last() {
                Some(&j) if end(sorted[j].1) >= end(s) => j,
                _ => i,
            };
            furthest.push(best);
        }
        Bases { sorted, furthest }
    }

    /// The segment holding all of `[addr, addr + len)` and the offset of `addr` in it, in
    /// O(log segments): the one of the greatest base at or below `addr` when it holds the
    /// range, else (segments that overlap) the one reaching furthest among those starting
    /// at or below `addr`, if it does.
    fn find(&self, addr: u64, len: u64) -> Option<(&'a str, u64)> {
        let below = self.sorted.partition_point(|&(b, _)| b <= addr);
        let last = below.checked_sub(1)?;
        let near = self.sorted[last].1;
        let far = self.sorted[self.furthest[last]].1;
        let s = [near, far].into_iter().find(|s| s.holds(addr, len))?;
        Some((&s.name, addr - s.base?))
    }
}

/// `entries` with every side named by address resolved to its segment and offset: this
/// agent's `local` segments, each remote agent's descriptor (`remote`). Borrowed as they are
/// when no entry names an address.
///
/// # Errors
/// [`Error::NoSegmentAt`] for an address range no segment holds whole (length 0 is left to
/// the plan's check); [`Error::UnknownAgent`] for a remote agent without a descriptor.
pub(crate) fn resolve<'e, 'd>(
    entries: &'e [Entry],
    me: &str,
    local: impl Iterator<Item = &'d SegmentDescriptor>,
    remote: impl Fn(&str) -> Option<&'d AgentDescriptor>,
) -> Result<Cow<'e, [Entry]>> {
    if !entries.iter().any(Entry::by_address) {
        return Ok(Cow::Borrowed(entries));
    }
    let mine = Bases::new(local);
    let mut theirs: HashMap<String, Bases<'d>> = HashMap::new();
    let mut out = entries.to_vec();
    for (i, e) in out.iter_mut().enumerate() {
        if e.len == 0 {
            continue;
        }
        let missing = |side, agent: &str, addr| Error::NoSegmentAt {
            entry: i,
            side,
            agent: agent.into(),
            addr,
            len: e.len,
        };
        // The remote side first: an unknown agent is the likelier mistake, and the one
        // Mooncake's callers expect to hear of.
        if e.remote_segment == BY_ADDRESS {
            if !theirs.contains_key(e.remote_agent.as_str()) {
                let d = remote(&e.remote_agent)
                    .ok_or_else(|| Error::UnknownAgent(e.remote_agent.clone()))?;
                theirs.insert(e.remote_agent.clone(), Bases::new(d.segments.iter()));
            }
            let (name, offset) = theirs[e.remote_agent.as_str()]
                .find(e.remote_offset, e.len)
                .ok_or_else(|| missing(Side::Remote, &e.remote_agent, e.remote_offset))?;
            (e.remote_segment, e.remote_offset) = (name.into(), offset);
        }
        if e.local == BY_ADDRESS {
            let (name, offset) = mine
                .find(e.local_offset, e.len)
                .ok_or_else(|| missing(Side::Local, me, e.local_offset))?;
            (e.local, e.local_offset) = (name.into(), offset);
        }
    }
    check_overlaps(&out, &mine)?;
    Ok(Cow::Owned(out))
}

/// Refuses a read whose local memory overlaps another entry's, between segments: segments
/// registered by address may overlap (two ranges of one buffer), where the plan's check,
/// which compares offsets within one segment, does not see it.
fn check_overlaps(entries: &[Entry], mine: &Bases<'_>) -> Result<()> {
    if !entries.iter().any(|e| e.op == Op::Read) {
        return Ok(());
    }
    let bases: HashMap<&str, u64> = mine.sorted.iter().map(|&(b, s)| (&*s.name, b)).collect();
    // (start, end, entry) of each entry's local memory, where its segment has an address.
    let mut spans: Vec<(u64, u64, usize)> = entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let start = bases.get(e.local.as_str())?.checked_add(e.local_offset)?;
            Some((start, start.checked_add(e.len)?, i))
        })
        .collect();
    spans.sort_unstable();
    let mut furthest: Option<(u64, usize)> = None;
    for &(start, end, i) in &spans {
        if let Some((f_end, f)) = furthest {
            let read = entries[i].op == Op::Read || entries[f].op == Op::Read;
            if start < f_end && read && entries[i].local != entries[f].local {
                return Err(Error::Overlap {
                    entry: i.max(f),
                    other: i.min(f),
                    segment: entries[i].local.clone(),
                });
            }
        }
        if furthest.is_none_or(|(f_end, _)| end > f_end) {
            furthest = Some((end, i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Batch;

    fn seg(name: &str, base: Option<u64>, len: u64) -> SegmentDescriptor {
        SegmentDescriptor {
            name: name.into(),
            len,
            base,
            remote_read: true,
            remote_write: true,
            regions: Vec::new(),
        }
    }

    fn peer() -> AgentDescriptor {
        AgentDescriptor {
            agent: "p".into(),
            incarnation: 1,
            segments: vec![
                seg("a", Some(0x10_000), 0x1000),
                seg("b", Some(0x20_000), 0x1000),
                seg("dmabuf", None, 0x1000_0000),
            ],
        }
    }

    fn run(batch: &Batch, local: &[SegmentDescriptor]) -> Result<Vec<Entry>> {
        let p = peer();
        resolve(&batch.entries, "me", local.iter(), |a| {
            (a == "p").then_some(&p)
        })
        .map(Cow::into_owned)
    }

    #[test]
    fn addresses_resolve_to_segments_and_offsets_both_sides() {
        let local = [
            seg("l1", Some(0x5000), 0x3000),
            seg("l0", Some(0x1000), 0x1000),
        ];
        let b = Batch::new()
            .write_at(0x5010, "p", 0x20_100, 0x10)
            .read_at(0x1000, "p", 0x10_000, 0x1000)
            .write("l1", 4, "p", "a", 8, 16);
        let e = run(&b, &local).unwrap();
        assert_eq!((&*e[0].local, e[0].local_offset), ("l1", 0x10));
        assert_eq!((&*e[0].remote_segment, e[0].remote_offset), ("b", 0x100));
        assert_eq!((&*e[1].local, e[1].local_offset), ("l0", 0));
        assert_eq!((&*e[1].remote_segment, e[1].remote_offset), ("a", 0));
        assert_eq!(e[2], b.entries[2], "named entries stay as they are");
    }

    #[test]
    fn a_batch_without_addresses_is_borrowed() {
        let b = Batch::new().write("x", 0, "p", "a", 0, 1);
        let p = peer();
        let r = resolve(&b.entries, "me", std::iter::empty(), |_| Some(&p)).unwrap();
        assert!(matches!(r, Cow::Borrowed(_)));
    }

    #[test]
    fn ranges_no_segment_holds_whole_are_refused_typed() {
        let local = [seg("l", Some(0x1000), 0x1000)];
        let cases = [
            (0x1000, 0x10_000 - 1, 2, Side::Remote),    // starts before a
            (0x1000, 0x10_ff0, 0x20, Side::Remote),     // runs past a's end
            (0x1000, 0x10_1000, 0x10, Side::Remote),    // between a and b
            (0x1000, u64::MAX - 4, 0x10, Side::Remote), // wraps
            (0x0fff, 0x10_000, 0x10, Side::Local),      // before l
            (0x1ff8, 0x10_000, 0x10, Side::Local),      // past l
        ];
        for (l, r, len, side) in cases {
            let b = Batch::new().write_at(l, "p", r, len);
            match run(&b, &local) {
                Err(Error::NoSegmentAt {
                    entry: 0,
                    side: s,
                    addr,
                    ..
                }) => {
                    assert_eq!(s, side, "{l:#x} {r:#x} {len}");
                    assert_eq!(addr, if side == Side::Local { l } else { r });
                }
                other => panic!("{l:#x} {r:#x} {len}: {other:?}"),
            }
        }
        let b = Batch::new().write_at(0x1000, "q", 0x10_000, 1);
        assert_eq!(run(&b, &local), Err(Error::UnknownAgent("q".into())));
    }

    #[test]
    fn a_peer_descriptor_named_otherwise_is_refused_not_a_panic() {
        let b = Batch::new().write_at(0x1000, "p", 0x10_000, 1);
        let local = [seg("l", Some(0x1000), 0x1000)];
        let mut other = peer();
        other.agent = "someone-else".into();
        let r = resolve(&b.entries, "me", local.iter(), |_| Some(&other));
        let e = r.unwrap().into_owned();
        assert_eq!(e[0].remote_segment, "a", "looked up by the entry's name");
    }

    #[test]
    fn reads_overlapping_across_segments_are_refused() {
        let local = [
            seg("small", Some(0x1000), 0x2000),
            seg("big", Some(0x2000), 0x10_000),
        ];
        // [0x1800, 0x2800) resolves to small, [0x2400, 0x2500) to big: they overlap.
        let b = Batch::new()
            .read_at(0x1800, "p", 0x10_000, 0x1000)
            .read_at(0x2400, "p", 0x20_000, 0x100);
        match run(&b, &local) {
            Err(Error::Overlap {
                entry: 1, other: 0, ..
            }) => {}
            other => panic!("{other:?}"),
        }
        // Writes may overlap (the NIC only reads them); disjoint reads are fine.
        let w = Batch::new()
            .write_at(0x1800, "p", 0x10_000, 0x1000)
            .write_at(0x2400, "p", 0x20_000, 0x100);
        assert!(run(&w, &local).is_ok());
        let d = Batch::new()
            .read_at(0x1000, "p", 0x10_000, 0x100)
            .read_at(0x5000, "p", 0x20_000, 0x100);
        assert!(run(&d, &local).is_ok());
    }

    #[test]
    fn a_look_up_among_many_overlapping_segments_stays_logarithmic() {
        // One big segment first, then many small ones above its base: every address
        // past the small ones' ends is held by the big one alone.
        let mut local = vec![seg("big", Some(0), 1 << 40)];
        local.extend((1..20_000u64).map(|i| seg(&format!("s{i}"), Some(i << 12), 16)));
        let mut b = Batch::new();
        for i in 1..20_000u64 {
            b = b.write_at((i << 12) + 64, "p", 0x10_000, 8);
        }
        let start = std::time::Instant::now();
        let e = run(&b, &local).unwrap();
        assert!(e.iter().all(|e| e.local == "big"));
        assert!(
            start.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn overlapping_segments_still_resolve() {
        let local = [
            seg("big", Some(0x1000), 0x10_000),
            seg("small", Some(0x2000), 0x100),
        ];
        // The nearest base below (small) does not hold it; big does.
        let b = Batch::new().write_at(0x2080, "p", 0x10_000, 0x1000);
        let e = run(&b, &local).unwrap();
        assert_eq!((&*e[0].local, e[0].local_offset), ("big", 0x1080));
    }
}
