//! The record of a scope's posts: the first [`INLINE`] kept in the scope itself, the rest in
//! a vector, so that a scope of a few posts (the usual one: a message and its reply) allocates
//! nothing.

use std::ops::Index;

/// How many posts a scope records without allocating.
pub(super) const INLINE: usize = 8;

/// Records in the order they were pushed, each at the index [`Entries::push`] returned.
pub(super) struct Entries<T> {
    /// The first [`INLINE`] records: `Some` below `len`, `None` from there.
    inline: [Option<T>; INLINE],
    /// The records after the first [`INLINE`].
    spill: Vec<T>,
    len: usize,
}

impl<T> Entries<T> {
    /// No records, nothing allocated.
    pub fn new() -> Self {
        Entries {
            inline: [const { None }; INLINE],
            spill: Vec::new(),
            len: 0,
        }
    }

    /// Records `e`; returns its index.
    #[inline]
    pub fn push(&mut self, e: T) -> usize {
        let i = self.len;
        match self.inline.get_mut(i) {
            Some(free) => *free = Some(e),
            None => self.spill.push(e),
        }
        self.len += 1;
        i
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The records, in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.inline
            .iter()
            .map_while(Option::as_ref)
            .chain(&self.spill)
    }
}

impl<T> Index<usize> for Entries<T> {
    type Output = T;

    /// The record at `i`.
    ///
    /// # Panics
    /// If `i` was not returned by [`Entries::push`].
    #[inline]
    fn index(&self, i: usize) -> &T {
        match self.inline.get(i) {
            Some(e) => e.as_ref().expect("an index push returned"),
            None => &self.spill[i - INLINE],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_their_index_past_the_inline_ones() {
        let mut e = Entries::new();
        for n in 0..(INLINE * 3) {
            assert_eq!(e.push(n * 10), n);
        }
        assert_eq!(e.len(), INLINE * 3);
        for n in 0..(INLINE * 3) {
            assert_eq!(e[n], n * 10);
        }
        let all: Vec<usize> = e.iter().copied().collect();
        assert_eq!(all, (0..INLINE * 3).map(|n| n * 10).collect::<Vec<_>>());
    }

    #[test]
    fn a_few_records_allocate_nothing() {
        let mut e = Entries::new();
        for n in 0..INLINE {
            e.push(n);
        }
        assert_eq!(e.spill.capacity(), 0);
        assert_eq!(e.iter().count(), INLINE);
        e.push(INLINE);
        assert_eq!(e.spill.len(), 1);
    }
}
