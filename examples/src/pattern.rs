//! A test pattern that differs in every 8-byte word, so that a misplaced page, a short
//! transfer or a stale buffer cannot pass for the right bytes.

/// Word `k` of the pattern for `seed` (splitmix64 of `seed` and `k`).
fn word(seed: u64, k: u64) -> u64 {
    let mut z = seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern for `seed`, as if `buf` started at byte `start` of it.
pub fn fill(buf: &mut [u8], seed: u64, start: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        let at = start + i as u64;
        *b = word(seed, at / 8).to_le_bytes()[(at % 8) as usize];
    }
}

/// The first offset in `buf` that differs from the pattern for `seed`, if any.
pub fn first_mismatch(buf: &[u8], seed: u64) -> Option<usize> {
    let mut chunks = buf.chunks_exact(8);
    for (k, c) in chunks.by_ref().enumerate() {
        let want = word(seed, k as u64).to_le_bytes();
        if c != want {
            return c
                .iter()
                .zip(want)
                .position(|(a, b)| *a != b)
                .map(|i| k * 8 + i);
        }
    }
    let tail_at = buf.len() - chunks.remainder().len();
    let mut want = vec![0; chunks.remainder().len()];
    fill(&mut want, seed, tail_at as u64);
    chunks
        .remainder()
        .iter()
        .zip(want)
        .position(|(a, b)| *a != b)
        .map(|i| tail_at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_buffer_matches_and_any_change_is_found() {
        let mut b = vec![0u8; 4099];
        fill(&mut b, 7, 0);
        assert_eq!(first_mismatch(&b, 7), None);
        assert_eq!(first_mismatch(&b, 8), Some(0));
        b[4097] ^= 1;
        assert_eq!(first_mismatch(&b, 7), Some(4097));
        b[4097] ^= 1;
        b[100] ^= 0x80;
        assert_eq!(first_mismatch(&b, 7), Some(100));
        // Pieces filled separately make the same bytes.
        let mut c = vec![0u8; 4099];
        let (x, y) = c.split_at_mut(1001);
        fill(x, 7, 0);
        fill(y, 7, 1001);
        assert_eq!(b.len(), c.len());
        b[100] ^= 0x80;
        assert_eq!(b, c);
    }
}
