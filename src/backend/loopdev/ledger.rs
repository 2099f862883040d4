//! The loop class's ledger: what each volume and snapshot promises, and how much of
//! each volume's image is on disk, kept as localvol changes them. A class's capacity,
//! and the space check of every create, expand and snapshot, then cost the same on a
//! node with 5,000 volumes as on an empty one, instead of a read of every record and
//! a stat of every image per call.
//!
//! It is counted from the storage when the class opens (nothing a crash can lose) and
//! again at every stats refresh. Between two counts, which volumes and snapshots exist
//! and their sizes change only through localvol's own calls, each of which puts its
//! change here after its commit point. What an image holds on disk also changes with
//! its pod's writes, which the ledger sees at the next count or the next stat of that
//! image (NodeGetVolumeStats, ReclaimSpace): a write since makes it count less of the
//! disk free than is (the side that refuses), and only a discard since (a raw block
//! volume's BLKDISCARD, a filesystem's own fstrim) makes it count more, by at most what
//! was discarded.

use std::collections::HashMap;

use crate::model::Token;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Image {
    size_bytes: u64,
    /// Its blocks on disk when last counted.
    allocated: u64,
}

impl Image {
    fn unbacked(self) -> u64 {
        self.size_bytes.saturating_sub(self.allocated)
    }
}

/// What the class's volumes and snapshots take and may still take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Totals {
    /// Bytes promised: every volume's size, and what each snapshot holds on disk
    /// (snapshots are never written).
    pub promised: u64,
    /// Bytes of the volumes' promises not yet backed by disk.
    pub unbacked: u64,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Ledger {
    volumes: HashMap<Token, Image>,
    snapshots: HashMap<Token, u64>,
    totals: Totals,
    /// Counts the changes of what exists and what it promises (a volume or snapshot
    /// made, grown or removed), so that a count from the storage that ran beside one
    /// does not undo it (see [`Ledger::recounted`]).
    generation: u64,
}

impl Ledger {
    /// A ledger counted from the storage: each volume's token, size and allocated
    /// bytes, and each snapshot's token and bytes.
    pub fn counted(
        volumes: impl IntoIterator<Item = (Token, u64, u64)>,
        snapshots: impl IntoIterator<Item = (Token, u64)>,
    ) -> Self {
        let mut ledger = Ledger::default();
        for (token, size_bytes, allocated) in volumes {
            ledger.insert(
                token,
                Image {
                    size_bytes,
                    allocated,
                },
            );
        }
        for (token, bytes) in snapshots {
            ledger.put_snapshot(token, bytes);
        }
        ledger.generation = 0;
        ledger
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    /// A volume made (or made again by an idempotent retry), with what its image holds.
    pub fn put_volume(&mut self, token: Token, size_bytes: u64, allocated: u64) {
        self.insert(
            token,
            Image {
                size_bytes,
                allocated,
            },
        );
    }

    /// A volume grown to `size_bytes`; its blocks on disk are what they were.
    pub fn resized(&mut self, token: &Token, size_bytes: u64) {
        if let Some(image) = self.volumes.get(token).copied() {
            self.replace(token.clone(), image, Image { size_bytes, ..image });
            self.generation += 1;
        }
    }

    /// An image's blocks on disk as just counted; a volume the ledger does not hold
    /// (deleted meanwhile) is not brought back.
    pub fn allocated(&mut self, token: &Token, allocated: u64) {
        if let Some(image) = self.volumes.get(token).copied() {
            self.replace(token.clone(), image, Image { allocated, ..image });
        }
    }

    pub fn remove_volume(&mut self, token: &Token) {
        if let Some(image) = self.volumes.remove(token) {
            self.totals.promised -= image.size_bytes;
            self.totals.unbacked -= image.unbacked();
            self.generation += 1;
        }
    }

    pub fn put_snapshot(&mut self, token: Token, bytes: u64) {
        self.remove_snapshot(&token);
        self.snapshots.insert(token, bytes);
        self.totals.promised += bytes;
        self.generation += 1;
    }

    pub fn remove_snapshot(&mut self, token: &Token) {
        if let Some(bytes) = self.snapshots.remove(token) {
            self.totals.promised -= bytes;
            self.generation += 1;
        }
    }

    /// Takes in a count from the storage that began when the ledger was at generation
    /// `since`. Nothing made or removed since: the count is the truth, whole. Otherwise
    /// a create or delete ran beside it and the count may have missed it either way:
    /// only the allocations of the volumes both hold are taken from it.
    pub fn recounted(&mut self, since: u64, fresh: Ledger) {
        if since == self.generation {
            let generation = self.generation;
            *self = fresh;
            self.generation = generation;
            return;
        }
        for (token, image) in fresh.volumes {
            self.allocated(&token, image.allocated);
        }
    }

    fn insert(&mut self, token: Token, image: Image) {
        match self.volumes.get(&token).copied() {
            Some(old) => self.replace(token, old, image),
            None => {
                self.totals.promised += image.size_bytes;
                self.totals.unbacked += image.unbacked();
                self.volumes.insert(token, image);
            }
        }
        self.generation += 1;
    }

    fn replace(&mut self, token: Token, old: Image, new: Image) {
        self.totals.promised = self.totals.promised - old.size_bytes + new.size_bytes;
        self.totals.unbacked = self.totals.unbacked - old.unbacked() + new.unbacked();
        self.volumes.insert(token, new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> Token {
        Token::parse(s).unwrap()
    }

    /// The totals, counted again from the entries: what every change must keep.
    fn recomputed(ledger: &Ledger) -> Totals {
        Totals {
            promised: ledger.volumes.values().map(|i| i.size_bytes).sum::<u64>()
                + ledger.snapshots.values().sum::<u64>(),
            unbacked: ledger.volumes.values().map(|i| i.unbacked()).sum(),
        }
    }

    #[test]
    fn totals_follow_every_change() {
        let mut ledger = Ledger::counted([(token("a"), 100, 10), (token("b"), 50, 80)], [(token("s"), 7)]);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 157,
                unbacked: 90
            }
        );
        ledger.put_volume(token("c"), 30, 0);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 187,
                unbacked: 120
            }
        );
        // A retried create puts the same volume again: counted once.
        ledger.put_volume(token("c"), 30, 5);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 187,
                unbacked: 115
            }
        );
        ledger.resized(&token("a"), 200);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 287,
                unbacked: 215
            }
        );
        ledger.allocated(&token("a"), 250);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 287,
                unbacked: 25
            }
        );
        ledger.remove_volume(&token("b"));
        ledger.remove_volume(&token("b"));
        ledger.remove_snapshot(&token("s"));
        ledger.put_snapshot(token("t"), 3);
        ledger.put_snapshot(token("t"), 3);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 233,
                unbacked: 25
            }
        );
        assert_eq!(ledger.totals(), recomputed(&ledger));
        assert_eq!(ledger.len(), 2);
    }

    #[test]
    fn what_it_does_not_hold_is_not_brought_back() {
        let mut ledger = Ledger::counted([(token("a"), 100, 0)], []);
        ledger.allocated(&token("gone"), 5);
        ledger.resized(&token("gone"), 500);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 100,
                unbacked: 100
            }
        );
        assert_eq!(ledger.len(), 1);
    }

    #[test]
    fn a_count_with_nothing_made_or_removed_beside_it_replaces_the_ledger() {
        let mut ledger = Ledger::counted([(token("a"), 100, 0)], []);
        let since = ledger.generation();
        // Only an allocation changed meanwhile: not a change of what exists.
        ledger.allocated(&token("a"), 40);
        let fresh = Ledger::counted([(token("a"), 100, 60), (token("made-by-hand"), 10, 0)], []);
        ledger.recounted(since, fresh);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 110,
                unbacked: 50
            }
        );
        assert_eq!(ledger.generation(), since);
    }

    #[test]
    fn a_count_beside_a_create_or_delete_keeps_what_exists_and_takes_allocations() {
        let mut ledger = Ledger::counted([(token("a"), 100, 0), (token("b"), 20, 0)], []);
        let since = ledger.generation();
        // The count read the records before "c" was made, "b" deleted and "a" grown.
        ledger.put_volume(token("c"), 30, 0);
        ledger.remove_volume(&token("b"));
        ledger.resized(&token("a"), 150);
        let fresh = Ledger::counted([(token("a"), 100, 60), (token("b"), 20, 20)], []);
        ledger.recounted(since, fresh);
        assert_eq!(
            ledger.totals(),
            Totals {
                promised: 180,
                unbacked: 120
            }
        );
        assert_eq!(ledger.len(), 2);
        assert_eq!(ledger.totals(), recomputed(&ledger));
    }
}
