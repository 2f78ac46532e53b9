//! Fuzzing of every parser of /proc and /sys text tracekit owns or feeds: /proc/stat
//! (`sysstat`), /proc/vmstat (`host::vmstat`, what memstall reports), cgroup counter files
//! (`host::cgroup`), mountinfo and /proc/<pid>/cgroup (`cgroup`).
//! Truncations and byte mutations of the seed corpus in `tests/fixtures` plus arbitrary text:
//! each parser returns a value or an error, never panics.

use std::path::Path;

use proptest::prelude::*;
use tracekit::host::{cgroup, sysstat::SysStat, vmstat::Vmstat};

fn corpus(dir: &str) -> Vec<Vec<u8>> {
    let d = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir);
    let mut out = Vec::new();
    for e in std::fs::read_dir(&d).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            out.push(std::fs::read(p).unwrap());
        }
    }
    assert!(!out.is_empty(), "seed corpus {} is empty", d.display());
    out
}

const MOUNTINFO: &str = "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n30 22 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n31 22 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
const PROC_CGROUP: &str = "12:memory:/kubepods/pod1/abc\n0::/system.slice/x.service\n";

fn all_parsers(text: &str) {
    let _ = SysStat::parse(text.as_bytes());
    let _ = Vmstat::parse(text);
    let _ = cgroup::parse_flat_keyed(text);
    let _ = tracekit::host::proc::kb_field(text, "AnonHugePages");
    let _ = cgroup::Layout::from_mountinfo(text);
    let _ = cgroup::memory_path(text.as_bytes());
}

/// Every truncation and 1 000 mutations of each seed.
fn mutate_seeds(seeds: &[Vec<u8>]) {
    let mut x: u64 = 0x2545f4914f6cdd1d;
    const ALPHABET: &[u8] = b" \n:0-9cpuctxtmemory/\xff";
    for seed in seeds {
        for cut in (0..seed.len()).step_by(5) {
            all_parsers(&String::from_utf8_lossy(&seed[..cut]));
        }
        for _ in 0..1000 {
            let mut m = seed.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x as usize) % m.len().max(1);
                if let Some(b) = m.get_mut(at) {
                    *b = ALPHABET[(x >> 40) as usize % ALPHABET.len()];
                }
            }
            all_parsers(&String::from_utf8_lossy(&m));
        }
    }
}

#[test]
fn seed_corpus_mutations_never_panic() {
    let mut seeds = corpus("proc");
    seeds.extend(corpus("memstall"));
    seeds.push(MOUNTINFO.as_bytes().to_vec());
    seeds.push(PROC_CGROUP.as_bytes().to_vec());
    mutate_seeds(&seeds);
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(s in "(.{0,40}\n){0,12}") {
        all_parsers(&s);
    }

    #[test]
    fn proc_stat_like_text_never_panics(s in "(cpu[0-9]? [0-9 ]{0,40}\n|ctxt [0-9a-z]{0,12}\n|procs_running [0-9-]{0,5}\n){0,10}") {
        let _ = SysStat::parse(s.as_bytes());
    }
}
