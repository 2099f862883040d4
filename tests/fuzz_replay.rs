//! The fuzz targets' properties on every test run, without libFuzzer: each property
//! (`localvol::*::fuzz`) is given its seeds (`fuzz/seeds/TARGET/`, and for the parsers of
//! tool output the real captures in `tests/fixtures/`), then a fixed number of inputs
//! made from them by byte-level mutations of the kinds libFuzzer starts with (bit flips,
//! interesting bytes, insertions, deletions, repeats, truncations, splices of two
//! seeds). The mutations come from a fixed seed, so a failure reproduces: its message
//! names the input's seed file and mutation number.
//!
//! This is the fuzzing CI pays for: the instrumented build of the libFuzzer targets cost
//! about 15 CPU minutes of every run (their 30-second runs found nothing in the runs on
//! record). Coverage-guided fuzzing runs in the soak (`LOCALVOL_SOAK=1 bash tests/all.sh`,
//! or `fuzz/run.sh SECONDS`), on the same properties.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Mutated inputs per seed file and target.
const MUTATIONS_PER_SEED: u32 = 5000;
/// The longest input made (libFuzzer's `-max_len` in fuzz/run.sh).
const MAX_LEN: usize = 8192;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The seed files of a target: its own seeds, and the captures named (`DIR`, extension).
fn seeds(target: &str, captures: &[(&str, &str)]) -> Vec<(PathBuf, Vec<u8>)> {
    let mut dirs = vec![(repo().join("fuzz/seeds").join(target), None)];
    dirs.extend(captures.iter().map(|(dir, ext)| (repo().join(dir), Some(*ext))));
    let mut found = Vec::new();
    for (dir, ext) in dirs {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a readable directory entry").path();
            if ext.is_some_and(|e| path.extension().and_then(|x| x.to_str()) != Some(e)) {
                continue;
            }
            let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            found.push((path, bytes));
        }
    }
    found.sort();
    assert!(!found.is_empty(), "{target}: no seed files");
    found
}

/// xorshift64*: deterministic, and enough to spread mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that change how a parser reads what follows them.
const INTERESTING: &[u8] = b"\0\xff\x7f\x80\n\r\t \"\\{}[]:,=-0119";

/// One to four mutations of `input`, with `other` for splices.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => out.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            3 => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 => {
                let end = (at + 1 + rng.below(32)).min(out.len());
                let piece = out[at.min(end)..end].to_vec();
                for _ in 0..=rng.below(3) {
                    out.splice(at..at, piece.iter().copied());
                }
            }
            5 => out.truncate(at),
            _ => {
                let from = rng.below(other.len() + 1);
                let to = (from + rng.below(256)).min(other.len());
                out.splice(at..at, other[from..to].iter().copied());
            }
        }
    }
    out.truncate(MAX_LEN);
    out
}

/// Runs `property` on every seed and on its mutations; panics name the input.
fn replay(target: &str, captures: &[(&str, &str)], property: fn(&[u8])) {
    let seeds = seeds(target, captures);
    // The mutations' seed is fixed; the target's name keeps the targets apart.
    let mut rng = Rng(target.bytes().fold(0x9e37_79b9_7f4a_7c15, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }));
    let mut runs = 0u64;
    for (index, (path, bytes)) in seeds.iter().enumerate() {
        let other = &seeds[(index + 1) % seeds.len()].1;
        let inputs = std::iter::once(bytes.clone())
            .chain((0..MUTATIONS_PER_SEED).map(|_| mutate(&mut rng, bytes, other)));
        for (n, input) in inputs.enumerate() {
            if panic::catch_unwind(AssertUnwindSafe(|| property(&input))).is_err() {
                panic!(
                    "{target}: the property failed on mutation {n} of {} (0 is the seed itself); the input: {:?}",
                    path.display(),
                    String::from_utf8_lossy(&input)
                );
            }
            runs += 1;
        }
    }
    println!(
        "{target}: {runs} inputs from {} seed files, no failure",
        seeds.len()
    );
}

#[test]
fn blkid_export() {
    replay("blkid_export", &[], localvol::fs::fuzz::blkid_export);
}

#[test]
fn config_yaml() {
    replay("config_yaml", &[], localvol::config::fuzz::config_yaml);
}

#[test]
fn lvm_report() {
    let captures = [("tests/fixtures/lvm", "json"), ("tests/fixtures/lvm", "stdout")];
    replay("lvm_report", &captures, localvol::backend::lvm::fuzz::lvm_report);
}

#[test]
fn mountinfo() {
    replay("mountinfo", &[], localvol::mount::fuzz::mountinfo);
}

#[test]
fn ndctl_json() {
    replay(
        "ndctl_json",
        &[("tests/fixtures/ndctl", "json")],
        localvol::backend::pmem::fuzz::ndctl_json,
    );
}

#[test]
fn request_conversion() {
    replay(
        "request_conversion",
        &[],
        localvol::request::fuzz::request_conversion,
    );
}

#[test]
fn mutations_change_inputs_and_stay_deterministic() {
    let seed = b"{\"report\": [{\"lv\": []}]}";
    let made = |start| {
        let mut rng = Rng(start);
        (0..100)
            .map(|_| mutate(&mut rng, seed, b"other"))
            .collect::<Vec<_>>()
    };
    assert_eq!(made(7), made(7));
    assert!(made(7).iter().filter(|m| m.as_slice() != seed).count() > 90);
    assert!(made(7).iter().all(|m| m.len() <= MAX_LEN));
}

/// The replay fails when a property does: a property that refuses a byte the mutations
/// put in is caught on one of the made inputs, not only on a seed.
#[test]
#[should_panic(expected = "the property failed on mutation")]
fn a_failing_property_fails_the_replay() {
    replay("mountinfo", &[], |data| assert!(!data.contains(&0xff)));
}
