//! One fence epoch being folded: parties arrive with the items they bring (PMI pairs, or a
//! node's PMIx blob), and once every party the caller counts on is in, the items go on as
//! one message. The root folds its child
//! proxies' `FenceIn`s into a `FenceOut`; a proxy folds its ranks and its child subtrees into
//! one `FenceIn` (see the proxy's `kvs`).
//!
//! ```text
//!  party ──arrive(pairs)──►┐
//!  party ──arrive(pairs)──►│ FenceFold ──complete(parties)──► (epoch, all pairs) ──► on
//!  put ─────add(pairs)────►┘   (once per epoch)              finish(epoch): next epoch
//! ```
//!
//! A PMIx fence's data may be larger than a frame: [`in_parts`] cuts it into parts.
//!
//! Pure: no I/O, no clock.

/// A key-value pair of the PMI key-value space.
pub type Pair = (String, String);

#[derive(Debug)]
pub struct FenceFold<T = Pair> {
    epoch: u64,
    /// Parties in the current epoch so far.
    arrived: usize,
    /// Items brought since the last completion.
    pairs: Vec<T>,
    /// The current epoch was completed and is waiting for [`FenceFold::finish`].
    completed: bool,
}

impl<T> Default for FenceFold<T> {
    fn default() -> Self {
        FenceFold { epoch: 0, arrived: 0, pairs: Vec::new(), completed: false }
    }
}

impl<T> FenceFold<T> {
    /// The epoch being folded.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Pairs that belong to the current epoch without a party arriving (a rank's put).
    pub fn add(&mut self, pairs: impl IntoIterator<Item = T>) {
        self.pairs.extend(pairs);
    }

    /// A party entered the fence, bringing `pairs`.
    pub fn arrive(&mut self, pairs: impl IntoIterator<Item = T>) {
        self.pairs.extend(pairs);
        self.arrived += 1;
    }

    /// A party that arrived leaves before the fence completed (a rank that failed inside it,
    /// the job going on without it): it no longer counts.
    pub fn leave(&mut self) {
        self.arrived = self.arrived.saturating_sub(1);
    }

    /// Once `parties` have arrived, and only once per epoch: the epoch and every pair it
    /// brought. The count of parties is the caller's, asked at each call.
    pub fn complete(&mut self, parties: usize) -> Option<(u64, Vec<T>)> {
        if self.completed || self.arrived < parties {
            return None;
        }
        self.completed = true;
        self.arrived = 0;
        Some((self.epoch, std::mem::take(&mut self.pairs)))
    }

    /// The completion of `epoch` came back (or was sent, at the root): the next epoch starts.
    /// Returns false if `epoch` was not the one folded, which is worth a warning.
    pub fn finish(&mut self, epoch: u64) -> bool {
        let expected = epoch == self.epoch;
        self.completed = false;
        self.epoch += 1;
        expected
    }
}

/// `blobs`, one after another, cut into parts of `part` bytes but the last, which is shorter
/// (perhaps empty) and always there.
pub fn in_parts(blobs: impl IntoIterator<Item = Vec<u8>>, part: usize) -> Vec<Vec<u8>> {
    let mut parts = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    for blob in blobs {
        // The usual fence is one blob smaller than a part: kept as it is, not copied.
        if current.is_empty() && blob.len() < part {
            current = blob;
            continue;
        }
        let mut rest = &blob[..];
        while !rest.is_empty() {
            let take = (part - current.len()).min(rest.len());
            current.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if current.len() == part {
                parts.push(std::mem::take(&mut current));
            }
        }
    }
    parts.push(current);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_cut_into_parts_in_order_with_a_last_part_always_there() {
        let blobs = || vec![b"abc".to_vec(), b"".to_vec(), b"defgh".to_vec()];
        assert_eq!(in_parts(blobs(), 3), [&b"abc"[..], b"def", b"gh"]);
        assert_eq!(in_parts(blobs(), 4), [&b"abcd"[..], b"efgh", b""]);
        assert_eq!(in_parts(blobs(), 100), [&b"abcdefgh"[..]]);
        assert_eq!(in_parts([], 4), [&b""[..]]);
    }

    #[test]
    fn blobs_fold_as_pairs_do() {
        let mut fold: FenceFold<Vec<u8>> = FenceFold::default();
        fold.arrive([b"node0".to_vec()]);
        fold.arrive([b"node1".to_vec()]);
        assert_eq!(
            fold.complete(2).map(|(e, blobs)| (e, blobs.concat())),
            Some((0, b"node0node1".to_vec()))
        );
    }

    fn pair(k: &str) -> Pair {
        (k.to_string(), format!("v{k}"))
    }

    #[test]
    fn completes_once_every_party_is_in_with_every_pair() {
        let mut fold = FenceFold::default();
        fold.add([pair("a")]);
        fold.arrive([pair("b")]);
        assert_eq!(fold.complete(2), None);
        fold.arrive([]);
        assert_eq!(fold.complete(2), Some((0, vec![pair("a"), pair("b")])));
        // Once per epoch, however often it is asked.
        assert_eq!(fold.complete(2), None);
        assert!(fold.finish(0));
        assert_eq!(fold.epoch(), 1);
        fold.arrive([]);
        assert_eq!(fold.complete(1), Some((1, vec![])));
    }

    #[test]
    fn fewer_parties_complete_the_epoch_at_once() {
        let mut fold = FenceFold::default();
        fold.arrive([pair("a")]);
        assert_eq!(fold.complete(3), None);
        // Two parties were lost: the one that arrived is all there is.
        assert_eq!(fold.complete(1), Some((0, vec![pair("a")])));
    }

    #[test]
    fn puts_after_completion_belong_to_the_next_epoch() {
        let mut fold = FenceFold::default();
        fold.arrive([]);
        assert!(fold.complete(1).is_some());
        fold.add([pair("late")]);
        assert!(!fold.finish(7), "another epoch's completion is noticed");
        fold.arrive([]);
        assert_eq!(fold.complete(1), Some((1, vec![pair("late")])));
    }
}
