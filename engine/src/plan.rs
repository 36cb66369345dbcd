//! Checking a batch against both sides' descriptors and cutting it into chunks: pure code,
//! run before anything is posted.

use crate::batch::{Entry, Op};
use crate::descriptor::{AgentDescriptor, DeviceRegion, SegmentDescriptor};
use crate::error::{Error, Result, Side};
use std::collections::HashMap;

/// The most chunks one batch may be cut into.
const MAX_CHUNKS: usize = 1 << 24;

/// One request the worker posts: a piece of an entry of at most the chunk size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// The entry it belongs to.
    pub entry: u32,
    pub op: Op,
    /// Index into [`Plan::segments`].
    pub segment: u16,
    /// The local device the segment is registered on.
    pub local_device: u16,
    /// Offset in the local segment.
    pub offset: u64,
    pub len: u64,
    /// Index into [`Plan::peers`].
    pub peer: u16,
    /// The remote device the remote segment is registered on.
    pub remote_device: u16,
    /// Index into [`Plan::remote_places`]: the remote segment, for rerouting.
    pub remote_segment: u16,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Chunks of one round have disjoint local ranges in each segment (the region is split
    /// into one shard per chunk); overlapping writes go to later rounds.
    pub round: u16,
}

/// A remote agent of a batch, as its descriptor named it when the batch was checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerTarget {
    pub agent: String,
    pub incarnation: u64,
}

/// A segment's registration on one device, as the plan needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub device: u16,
    /// 0 the nearest to the memory (see [`DeviceRegion::tier`]).
    pub tier: u8,
    pub addr: u64,
    pub rkey: u32,
}

impl From<&DeviceRegion> for Place {
    fn from(r: &DeviceRegion) -> Place {
        Place {
            device: r.device,
            tier: r.tier,
            addr: r.addr,
            rkey: r.rkey,
        }
    }
}

/// A checked batch.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The local segments used, by name.
    pub segments: Vec<String>,
    /// Each local device's weight in striping (its link rate), by device index.
    pub weights: Vec<u32>,
    /// Each local segment's registrations (by the index of [`Plan::segments`]).
    pub local_places: Vec<Vec<Place>>,
    /// Each (peer, remote segment)'s registrations (by [`Chunk::remote_segment`]).
    pub remote_places: Vec<Vec<Place>>,
    /// Each remote segment's name (by [`Chunk::remote_segment`]).
    pub remote_names: Vec<String>,
    pub peers: Vec<PeerTarget>,
    pub chunks: Vec<Chunk>,
    /// How many rounds the chunks need (1 unless writes overlap locally).
    pub rounds: u16,
    /// Chunks per entry.
    pub chunks_per_entry: Vec<u32>,
}

/// Index of `key` in `list`, added if new.
fn index_of<'a>(map: &mut HashMap<&'a str, u16>, key: &'a str, what: &str) -> Result<u16> {
    let n = map.len();
    if let Some(&i) = map.get(key) {
        return Ok(i);
    }
    let i =
        u16::try_from(n).map_err(|_| Error::BatchTooLarge(format!("more than 65536 {what}")))?;
    map.insert(key, i);
    Ok(i)
}

/// Refuses a segment whose registration on some device would end past the end of the
/// address space (`addr + len` overflows): a peer's descriptor is input, and every address a
/// chunk is given is computed inside `[addr, addr + len)`.
fn check_regions(entry: usize, side: Side, s: &SegmentDescriptor) -> Result<()> {
    match s
        .regions
        .iter()
        .find(|r| r.addr.checked_add(s.len).is_none())
    {
        None => Ok(()),
        Some(r) => Err(Error::Protocol(format!(
            "entry {entry}: {side:?} segment {:?} of {} bytes at {:#x} on device {} ends past \
             the end of the address space (a malformed descriptor)",
            s.name, s.len, r.addr, r.device
        ))),
    }
}

fn in_range(entry: usize, side: Side, offset: u64, len: u64, segment_len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= segment_len => Ok(()),
        _ => Err(Error::OutOfRange {
            entry,
            side,
            offset,
            len,
            segment_len,
        }),
    }
}

/// Checks every entry (see [`Agent::transfer`](crate::Agent::transfer) for the list) and
/// cuts the entries into chunks of at most `chunk_size` bytes.
pub(crate) fn plan<'l, 'r>(
    entries: &[Entry],
    local_agent: &str,
    local: impl Fn(&str) -> Option<&'l SegmentDescriptor>,
    remote: impl Fn(&str) -> Option<&'r AgentDescriptor>,
    chunk_size: u64,
    weights: &[u32],
) -> Result<Plan> {
    assert!(chunk_size > 0, "the settings refuse a chunk size of 0");
    if entries.is_empty() {
        return Err(Error::EmptyBatch);
    }
    if u32::try_from(entries.len()).is_err() {
        return Err(Error::BatchTooLarge(format!("{} entries", entries.len())));
    }
    let mut segments = HashMap::new();
    let mut local_places: Vec<Vec<Place>> = Vec::new();
    let mut remotes: HashMap<(&str, &str), u16> = HashMap::new();
    let mut remote_places: Vec<Vec<Place>> = Vec::new();
    let mut remote_names: Vec<String> = Vec::new();
    let mut peers: HashMap<&str, u16> = HashMap::new();
    let mut peer_list = Vec::new();
    let mut stripes: HashMap<(u16, u16), Stripe> = HashMap::new();
    // Sized up front, so that the plan costs the same few allocations for any chunk count.
    let total = entries
        .iter()
        .map(|e| e.len.div_ceil(chunk_size))
        .fold(0u64, u64::saturating_add);
    // Refused before anything is sized by it (a peer's segment may claim any length).
    if total > MAX_CHUNKS as u64 {
        return Err(Error::BatchTooLarge(format!(
            "more than {MAX_CHUNKS} chunks (raise the chunk size or split the batch)"
        )));
    }
    let mut chunks = Vec::with_capacity(total as usize);
    let mut chunks_per_entry = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        if e.len == 0 {
            return Err(Error::ZeroLength { entry: i });
        }
        let unknown = |agent: &str, segment: &str| Error::UnknownSegment {
            agent: agent.into(),
            segment: segment.into(),
        };
        let l = local(&e.local).ok_or_else(|| unknown(local_agent, &e.local))?;
        let a =
            remote(&e.remote_agent).ok_or_else(|| Error::UnknownAgent(e.remote_agent.clone()))?;
        let r = a
            .segment(&e.remote_segment)
            .ok_or_else(|| unknown(&a.agent, &e.remote_segment))?;
        in_range(i, Side::Local, e.local_offset, e.len, l.len)?;
        in_range(i, Side::Remote, e.remote_offset, e.len, r.len)?;
        let (allowed, needs) = match e.op {
            Op::Write => (r.remote_write, "remote write"),
            Op::Read => (r.remote_read, "remote read"),
        };
        if !allowed {
            return Err(Error::Access {
                entry: i,
                side: Side::Remote,
                segment: r.name.clone(),
                needs,
            });
        }
        if l.regions.is_empty() || r.regions.is_empty() {
            return Err(Error::Protocol(format!(
                "entry {i}: a segment registered on no device"
            )));
        };
        let segment = index_of(&mut segments, &e.local, "local segments")?;
        if usize::from(segment) == local_places.len() {
            check_regions(i, Side::Local, l)?;
            local_places.push(l.regions.iter().map(Place::from).collect());
        }
        let remote_segment = match remotes.get(&(e.remote_agent.as_str(), &e.remote_segment)) {
            Some(&i) => i,
            None => {
                let next = u16::try_from(remote_places.len())
                    .map_err(|_| Error::BatchTooLarge("more than 65536 remote segments".into()))?;
                check_regions(i, Side::Remote, r)?;
                remotes.insert((&e.remote_agent, &e.remote_segment), next);
                remote_places.push(r.regions.iter().map(Place::from).collect());
                remote_names.push(r.name.clone());
                next
            }
        };
        let peer = index_of(&mut peers, &e.remote_agent, "remote agents")?;
        if usize::from(peer) == peer_list.len() {
            peer_list.push(PeerTarget {
                agent: a.agent.clone(),
                incarnation: a.incarnation,
            });
        }
        let n = e.len.div_ceil(chunk_size);
        let too_many = || Error::BatchTooLarge(format!("more than {MAX_CHUNKS} chunks"));
        match (chunks.len() as u64).checked_add(n) {
            Some(all) if all <= MAX_CHUNKS as u64 => {}
            _ => return Err(too_many()),
        }
        let per_entry = u32::try_from(n).map_err(|_| too_many())?;
        let (lp, rp) = (
            &local_places[usize::from(segment)],
            &remote_places[usize::from(remote_segment)],
        );
        let stripe = stripes
            .entry((segment, remote_segment))
            .or_insert_with(|| stripe(lp, rp, |_, _| true, weights).expect("both registered"));
        for k in 0..n {
            let (lr, rr) = stripe.pick(lp, rp, chunks.len());
            // `at` < `e.len`, and both ranges were checked inside their segments, whose
            // regions end inside the address space: none of these sums overflows, and one
            // that did would be refused, not wrapped.
            let cut = k.checked_mul(chunk_size).and_then(|at| {
                Some((
                    e.local_offset.checked_add(at)?,
                    e.len.checked_sub(at)?,
                    rr.addr.checked_add(e.remote_offset)?.checked_add(at)?,
                ))
            });
            let Some((offset, left, remote_addr)) = cut else {
                return Err(Error::OutOfRange {
                    entry: i,
                    side: Side::Remote,
                    offset: e.remote_offset,
                    len: e.len,
                    segment_len: r.len,
                });
            };
            chunks.push(Chunk {
                entry: i as u32,
                op: e.op,
                segment,
                local_device: lr.device,
                offset,
                len: chunk_size.min(left),
                peer,
                remote_device: rr.device,
                remote_segment,
                remote_addr,
                rkey: rr.rkey,
                round: 0,
            });
        }
        chunks_per_entry.push(per_entry);
    }
    check_overlaps(entries)?;
    let rounds = assign_rounds(&mut chunks)?;
    let mut names = vec![String::new(); segments.len()];
    for (name, i) in segments {
        names[usize::from(i)] = name.to_string();
    }
    Ok(Plan {
        segments: names,
        weights: weights.to_vec(),
        local_places,
        remote_places,
        remote_names,
        peers: peer_list,
        chunks,
        rounds,
        chunks_per_entry,
    })
}

/// The rails between a local segment and a remote one: the pairs of devices of the same
/// index both are registered on (rail i to the peer's rail i), or, with none in common,
/// every pair (any local device reaches any remote one: the queue pairs are per device
/// pair).
fn rails<'a>(l: &'a [Place], r: &'a [Place]) -> impl Iterator<Item = (usize, usize)> + 'a {
    let common = l.iter().any(|a| r.iter().any(|b| b.device == a.device));
    (0..l.len()).flat_map(move |a| {
        (0..r.len())
            .filter(move |&b| !common || r[b].device == l[a].device)
            .map(move |b| (a, b))
    })
}

/// The rails chunks between two segments take, and in what order: the nearest of the
/// rails that `usable` keeps (those of the least tier sum, local + remote: the NIC nearest
/// each side's memory), each taken in proportion to its local device's weight.
#[derive(Debug)]
pub(crate) struct Stripe {
    /// (index into the local places, index into the remote places).
    rails: Vec<(usize, usize)>,
    /// One cycle of rail indices, each rail as often as its weight, spread out.
    cycle: Vec<u8>,
}

/// The longest cycle: weights are scaled down to fit (a rail keeps at least one turn).
const MAX_CYCLE: u32 = 64;

/// The most rails a stripe takes (the nearest first, in device order).
const MAX_RAILS: usize = 1 << u8::BITS;

impl Stripe {
    /// The rail of chunk number `k`: (local place, remote place).
    pub fn pick<'a>(&self, l: &'a [Place], r: &'a [Place], k: usize) -> (&'a Place, &'a Place) {
        let (a, b) = self.rails[usize::from(self.cycle[k % self.cycle.len()])];
        (&l[a], &r[b])
    }
}

/// The stripe between `l` and `r` over the rails `usable` keeps; `None` if none is usable.
pub(crate) fn stripe(
    l: &[Place],
    r: &[Place],
    usable: impl Fn(u16, u16) -> bool,
    weights: &[u32],
) -> Option<Stripe> {
    let tier = |(a, b): (usize, usize)| u16::from(l[a].tier) + u16::from(r[b].tier);
    let ok: Vec<(usize, usize)> = rails(l, r)
        .filter(|&(a, b)| usable(l[a].device, r[b].device))
        .collect();
    let best = ok.iter().map(|&p| tier(p)).min()?;
    // At most MAX_RAILS (the cycle numbers them in a byte): a peer's descriptor may list
    // many devices, and with none in common every pair is a rail.
    let rails: Vec<(usize, usize)> = ok
        .into_iter()
        .filter(|&p| tier(p) == best)
        .take(MAX_RAILS)
        .collect();
    let w: Vec<u32> = rails
        .iter()
        .map(|&(a, _)| {
            weights
                .get(usize::from(l[a].device))
                .copied()
                .unwrap_or(1)
                .max(1)
        })
        .collect();
    Some(Stripe {
        cycle: cycle(&w),
        rails,
    })
}

/// A smooth weighted round-robin cycle over `w` (each index as often as its weight, reduced
/// by their common divisor and scaled to at most [`MAX_CYCLE`] turns, spread out: 5, 5, 2, 2
/// gives 0 1 2 3 0 1 0 1 2 0 1 3 0 1).
fn cycle(w: &[u32]) -> Vec<u8> {
    let g = w.iter().fold(0, |g, &x| gcd(g, x)).max(1);
    let mut w: Vec<u64> = w.iter().map(|&x| u64::from(x / g)).collect();
    let sum: u64 = w.iter().sum();
    if sum > u64::from(MAX_CYCLE) {
        w = w
            .iter()
            .map(|&x| (x * u64::from(MAX_CYCLE) / sum).max(1))
            .collect();
    }
    let total: u64 = w.iter().sum();
    let mut current = vec![0i64; w.len()];
    let mut out = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, &x) in current.iter_mut().zip(&w) {
            *c += x as i64;
        }
        let i = (0..w.len()).max_by_key(|&i| (current[i], std::cmp::Reverse(i)));
        let i = i.expect("at least one rail");
        current[i] -= total as i64;
        out.push(i as u8);
    }
    out
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `ch` moved onto the rail `stripe` gives turn `k` (its remote address rebased onto that
/// device's region of the remote segment); `None` if the addresses do not fit (never
/// expected: a descriptor lists each device once, and its regions cover the same memory).
pub(crate) fn reroute(plan: &Plan, ch: &Chunk, stripe: &Stripe, k: usize) -> Option<Chunk> {
    let lp = &plan.local_places[usize::from(ch.segment)];
    let rp = &plan.remote_places[usize::from(ch.remote_segment)];
    let old = rp.iter().find(|p| p.device == ch.remote_device)?;
    let (a, b) = stripe.pick(lp, rp, k);
    let offset = ch.remote_addr.checked_sub(old.addr)?;
    Some(Chunk {
        local_device: a.device,
        remote_device: b.device,
        remote_addr: b.addr.checked_add(offset)?,
        rkey: b.rkey,
        ..*ch
    })
}

/// Refuses a read whose local range overlaps any other entry's in the same segment. The
/// entries' ranges were checked inside their segments (their ends do not overflow; the
/// sums saturate all the same).
fn check_overlaps(entries: &[Entry]) -> Result<()> {
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&entries[a], &entries[b]);
        (&a.local, a.local_offset).cmp(&(&b.local, b.local_offset))
    });
    // The entry reaching furthest so far in the current segment.
    let mut furthest: Option<usize> = None;
    for &i in &order {
        let e = &entries[i];
        if let Some(f) = furthest.filter(|&f| entries[f].local == e.local) {
            let fe = &entries[f];
            let end = |e: &Entry| e.local_offset.saturating_add(e.len);
            if e.local_offset < end(fe) {
                if e.op == Op::Read || fe.op == Op::Read {
                    return Err(Error::Overlap {
                        entry: i,
                        other: f,
                        segment: e.local.clone(),
                    });
                }
                if end(e) <= end(fe) {
                    continue;
                }
            }
        }
        furthest = Some(i);
    }
    Ok(())
}

/// Gives each chunk the first round in which its local range overlaps no other chunk of
/// its segment (greedy by start offset, which uses the fewest rounds); returns the count.
fn assign_rounds(chunks: &mut [Chunk]) -> Result<u16> {
    let mut order: Vec<usize> = (0..chunks.len()).collect();
    order.sort_unstable_by_key(|&c| (chunks[c].segment, chunks[c].offset, c));
    let mut ends: Vec<u64> = Vec::new();
    let mut segment = None;
    let mut rounds = 1;
    let too_deep = || Error::BatchTooLarge("writes overlapping 65536 deep".into());
    for c in order {
        if segment != Some(chunks[c].segment) {
            segment = Some(chunks[c].segment);
            ends.clear();
        }
        let r = match ends.iter().position(|&end| end <= chunks[c].offset) {
            Some(r) => r,
            None => {
                ends.push(0);
                ends.len() - 1
            }
        };
        // Inside the segment, as checked: never saturates.
        ends[r] = chunks[c].offset.saturating_add(chunks[c].len);
        chunks[c].round = u16::try_from(r).map_err(|_| too_deep())?;
        rounds = rounds.max(r + 1);
    }
    u16::try_from(rounds).map_err(|_| too_deep())
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
