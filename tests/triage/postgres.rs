//! A real PostgreSQL's WAL flushes under triage: one fsync finding for the cluster.

use super::*;

/// A PostgreSQL 15 cluster of the test's own (Debian's binaries, run as `postgres`, on a
/// Unix socket only, fsync on): stopped (fast shutdown) and removed when dropped.
struct Postgres {
    dir: std::path::PathBuf,
    port: u16,
    child: Child,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

impl Postgres {
    fn start() -> Postgres {
        assert!(
            std::path::Path::new(PG_BIN).join("postgres").exists(),
            "{PG_BIN}/postgres missing: `cargo xtask test` installs postgresql"
        );
        let dir = scratch("pg");
        let data = dir.join("data");
        let (uid, gid) = {
            let out = Command::new("id")
                .args(["-u", "postgres"])
                .output()
                .unwrap();
            let u: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
            let out = Command::new("id")
                .args(["-g", "postgres"])
                .output()
                .unwrap();
            (
                u,
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<u32>()
                    .unwrap(),
            )
        };
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let as_pg = |bin: &str| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(format!("{PG_BIN}/{bin}"));
            c
        };
        let st = as_pg("initdb")
            .args(["-A", "trust", "--no-sync", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "initdb: {st}");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = as_pg("postgres")
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args(["-p", &port.to_string()])
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
            ])
            .args(["-c", "wal_sync_method=fdatasync", "-c", "max_wal_size=1GB"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pg = Postgres { dir, port, child };
        let up = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            pg.sql("select 1").is_some()
        });
        assert!(up, "postgres did not start");
        pg
    }

    /// Runs `q` with psql as `postgres`; its unaligned output, `None` on failure.
    fn sql(&self, q: &str) -> Option<String> {
        let out = Command::new("psql")
            .args(["-X", "-tA", "-U", "postgres", "-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-c", q, "postgres"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn pgbench(&self, args: &[&str]) -> String {
        let out = Command::new("pgbench")
            .args(["-U", "postgres", "-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .args(args)
            .arg("postgres")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pgbench {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `pg_stat_wal.wal_sync`: WAL flushes the server issued (fdatasync here).
    fn wal_syncs(&self) -> u64 {
        self.sql("select wal_sync from pg_stat_wal")
            .and_then(|v| v.parse().ok())
            .expect("pg_stat_wal")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // The postmaster's pid is the first line of postmaster.pid; SIGINT is a fast shutdown.
        if let Some(pid) = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
        {
            // SAFETY: a signal to the server this test started.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Issue #33 (1): pgbench against PostgreSQL made one fsync finding per backend and none for
/// the WAL flushes. Now the backends and the walwriter are one finding whose calls equal
/// `pg_stat_wal.wal_sync`, bracketed: the delta read inside triage's window (around pgbench)
/// is at most what triage counted, the delta read outside it at least.
#[test]
fn postgres_wal_flushes_are_one_fsync_finding() {
    require_root();
    let _s = serial();
    let pg = Postgres::start();
    pg.pgbench(&["-i", "-q", "-s", "1"]);
    pg.sql("checkpoint").expect("checkpoint");
    let outer0 = pg.wal_syncs();
    let (mut inner, mut report) = (0, String::new());
    let (f, _) = triage(8, &[], || {
        let i0 = pg.wal_syncs();
        report = pg.pgbench(&["-n", "-c", "8", "-j", "2", "-T", "4"]);
        inner = pg.wal_syncs() - i0;
    });
    let outer = pg.wal_syncs() - outer0;
    eprintln!(
        "{}",
        report
            .lines()
            .filter(|l| l.contains("tps") || l.contains("latency"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for l in brief(&f).iter().take(5) {
        eprintln!("{l}");
    }
    let fs: Vec<&Value> = f
        .iter()
        .filter(|x| x["cause"] == "fsync" && x["comm"] == "postgres")
        .collect();
    assert_eq!(fs.len(), 1, "one finding for the service: {:#?}", brief(&f));
    let g = fs[0];
    let members = g["members"].as_array().map_or(0, Vec::len);
    assert!(members >= 2, "grouped: {g}");
    let calls = g["evidence"]["calls"].as_u64().unwrap();
    eprintln!("pg_stat_wal.wal_sync: inside {inner} <= triage {calls} <= outside {outer}; {members} members");
    assert!(
        inner > 0 && inner <= calls && calls <= outer,
        "wal_sync inside {inner} <= calls {calls} <= outside {outer}: {g}"
    );
}
