//! The kernels `vm-test` boots, and getting them: each is a Debian kernel package found through
//! a private apt configuration (its own sources list, lists and cache directories under
//! ~/.cache/tracekit/vm/<suite>/apt), so the host's apt setup is never read for it or changed.
//! Only the kernel image is kept, unpacked, beside that state.

use std::{
    cmp::Ordering,
    env, fs,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, SystemTime},
};

use anyhow::{bail, Context as _, Result};

use crate::{root, status};

/// One kernel of the test list.
#[derive(Debug)]
pub struct Spec {
    /// Short name used on the command line and in reports (`5.10`).
    pub name: &'static str,
    pub distro: &'static str,
    /// Archive suites the private sources list names; the first also names the cache directory.
    pub suites: &'static [&'static str],
    /// Package name, `*` matching a version number; the highest match wins.
    pub package: &'static str,
    /// Tools allowed to end `degraded` (doctor: cannot run, tool: exit 4 with one line) on this
    /// kernel, with what the kernel lacks. Anything else not `ok` fails the test.
    pub degraded: &'static [(&'static str, &'static str)],
    /// Tools whose guest check ends `known-fail` on this kernel (the check names the userspace
    /// change it waits for), with what goes wrong. Listed here so the test stays green while
    /// saying so on every run; a listed tool that passes fails the test until it is removed.
    pub known_failures: &'static [(&'static str, &'static str)],
}

impl Spec {
    fn cache(&self) -> PathBuf {
        cache_dir().join(self.suites[0])
    }
}

/// The kernels production runs (issue #20): the oldest supported LTS, Debian stable's previous
/// and current kernels. The host kernel is tested apart, by the root tests.
pub const KERNELS: &[Spec] = &[
    Spec {
        name: "5.10",
        distro: "Debian 11",
        suites: &["bullseye"],
        // Pinned: bullseye's last point release, frozen, so the oldest kernel does not drift.
        package: "linux-image-5.10.0-30-amd64-unsigned",
        degraded: &[],
        known_failures: &[],
    },
    Spec {
        name: "6.1",
        distro: "Debian 12",
        suites: &["bookworm", "bookworm-security"],
        // The same build as the signed image `linux-image-amd64` depends on, without the
        // signature a VM without Secure Boot does not check.
        package: "linux-image-6.1.0-*-amd64-unsigned",
        degraded: &[],
        known_failures: &[],
    },
    Spec {
        name: "6.12",
        distro: "Debian 13",
        suites: &["trixie", "trixie-security"],
        package: "linux-image-6.12.*+deb13-amd64-unsigned",
        degraded: &[],
        known_failures: &[],
    },
];

/// Kernels named in `list` (comma or space separated; empty or `all`: every one).
pub fn select(list: &str) -> Result<Vec<&'static Spec>> {
    let names: Vec<&str> = list
        .split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() || names == ["all"] {
        return Ok(KERNELS.iter().collect());
    }
    let mut out = Vec::new();
    for n in names {
        let spec = KERNELS.iter().find(|k| k.name == n).with_context(|| {
            let known: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
            format!(
                "no kernel {n:?} in the VM list (known: {})",
                known.join(", ")
            )
        })?;
        if !out.iter().any(|k: &&Spec| k.name == spec.name) {
            out.push(spec);
        }
    }
    Ok(out)
}

/// `*` matches a version number (one or more digits and dots), so `6.1.0-*-amd64` takes ABI 57
/// but not the `57-cloud` flavour; everything else matches itself.
pub fn glob_match(pattern: &str, s: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), s.as_bytes());
    fn at(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => {
                let run = s
                    .iter()
                    .take_while(|c| c.is_ascii_digit() || **c == b'.')
                    .count();
                (1..=run).rev().any(|n| at(rest, &s[n..]))
            }
            Some((c, rest)) => s.first() == Some(c) && at(rest, &s[1..]),
        }
    }
    at(p, s)
}

/// Orders names with digit runs compared as numbers, so ABI 46 sorts after 9 and 6.12.118
/// after 6.12.99.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, _) => return Ordering::Less,
            (_, None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let na = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let nb = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (da, db) = (&a[..na], &b[..nb]);
                let trim = |d: &[u8]| -> usize { d.iter().take_while(|&&c| c == b'0').count() };
                let (ta, tb) = (&da[trim(da)..], &db[trim(db)..]);
                let o = ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb));
                if o != Ordering::Equal {
                    return o;
                }
                a = &a[na..];
                b = &b[nb..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

/// The newest of `names` matching `pattern`.
pub fn pick<'a>(pattern: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    names
        .into_iter()
        .filter(|n| glob_match(pattern, n))
        .max_by(|a, b| natural_cmp(a, b))
}

pub fn cache_dir() -> PathBuf {
    let base = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| root().join("target"));
    base.join("tracekit/vm")
}

/// apt-get / apt-cache confined to the spec's own state: sources, lists and package cache all
/// under `dir`, nothing of the host's apt configuration but its keyring and proxy settings.
struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    fn new(spec: &Spec) -> Result<PrivateApt> {
        let dir = spec.cache().join("apt");
        for d in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(d))
                .with_context(|| format!("creating {}", dir.join(d).display()))?;
        }
        let sources: String = spec
            .suites
            .iter()
            .map(|s| {
                let archive = if s.ends_with("-security") {
                    "debian-security"
                } else {
                    "debian"
                };
                format!(
                    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/{archive} {s} main\n"
                )
            })
            .collect();
        let list = dir.join("sources.list");
        if fs::read_to_string(&list).ok().as_deref() != Some(sources.as_str()) {
            fs::write(&list, sources).with_context(|| format!("writing {}", list.display()))?;
        }
        Ok(PrivateApt { dir })
    }

    fn cmd(&self, tool: &str, args: &[&str]) -> Command {
        let d = |p: &str| self.dir.join(p).display().to_string();
        let mut c = Command::new(tool);
        c.env("DEBIAN_FRONTEND", "noninteractive")
            .arg("-q")
            .args(["-o", &format!("Dir::Etc::sourcelist={}", d("sources.list"))])
            .args(["-o", "Dir::Etc::sourceparts=-"])
            .args(["-o", &format!("Dir::State::Lists={}", d("lists"))])
            .args(["-o", &format!("Dir::Cache={}", d("cache"))])
            // The cache lives in root's home, which the `_apt` user cannot enter: without this
            // apt warns on every download that it falls back to running as root anyway.
            .args(["-o", "APT::Sandbox::User=root"]);
        // Only the package indexes: the host's appstream configuration would add ~4 MB per suite.
        for t in [
            "DEP-11",
            "DEP-11-icons",
            "DEP-11-icons-small",
            "DEP-11-icons-hidpi",
        ] {
            c.args([
                "-o",
                &format!("Acquire::IndexTargets::deb::{t}::DefaultEnabled=false"),
            ]);
        }
        c.args(args);
        c
    }

    /// Age of the package lists, None when there are none yet.
    fn lists_age(&self) -> Option<Duration> {
        fs::read_dir(self.dir.join("lists"))
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
            .filter_map(|e| e.metadata().ok()?.modified().ok())
            .max()
            .map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
    }

    fn update(&self) -> Result<()> {
        let mut c = self.cmd("apt-get", &["update"]);
        c.stdout(Stdio::null());
        status(c)
    }

    fn package_names(&self) -> Result<Vec<String>> {
        let out = self
            .cmd("apt-cache", &["search", "--names-only", "^linux-image-"])
            .output()
            .context("running apt-cache search")?;
        if !out.status.success() {
            bail!(
                "apt-cache search failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(" - ").next())
            .map(|n| n.trim().to_string())
            .collect())
    }
}

/// An exclusive lock on `path` for as long as the value lives: work trees share the cache and
/// apt refuses to run twice on the same lists.
struct Lock {
    _file: fs::File,
}

impl Lock {
    fn take(path: &Path) -> Result<Lock> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on an fd we own; released when the file is closed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(Lock { _file: f })
    }
}

/// Lists older than this are refreshed before resolving, so a new point release gets picked up.
const LISTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Path of the spec's kernel image (the ELF vmlinux when it could be extracted), downloading and
/// unpacking the package when it is not cached.
pub fn kernel(spec: &Spec) -> Result<PathBuf> {
    let cache = spec.cache();
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let _lock = Lock::take(&cache.join(".lock"))?;
    let apt = PrivateApt::new(spec)?;
    let fresh = apt.lists_age().is_some_and(|a| a < LISTS_MAX_AGE);
    if !fresh {
        if let Err(e) = apt.update() {
            // Offline: old lists or a cached image may still do.
            eprintln!("xtask: {}: apt-get update failed ({e:#})", spec.name);
        }
    }
    let resolved = apt
        .package_names()
        .ok()
        .and_then(|n| pick(spec.package, n.iter().map(String::as_str)).map(String::from));
    let Some(pkg) = resolved else {
        if let Some(k) = cached(spec).last() {
            eprintln!(
                "xtask: {}: apt names no {}; using the cached {}",
                spec.name,
                spec.package,
                k.display()
            );
            return Ok(uncompressed(k));
        }
        bail!(
            "{} ({}): no package {} in {} (private apt state in {})",
            spec.name,
            spec.distro,
            spec.package,
            spec.suites.join(" "),
            apt.dir.display()
        );
    };
    let image = cache.join(format!("{pkg}.vmlinuz"));
    if image.exists() {
        return Ok(uncompressed(&image));
    }
    eprintln!(
        "xtask: downloading {pkg} ({} {}, for the VM tests)",
        spec.distro, spec.name
    );
    if let Err(e) = download(&apt, &pkg, &image) {
        // Lists that name a package the mirror has since dropped: refresh once.
        eprintln!("xtask: {}: {e:#}; refreshing the package lists", spec.name);
        apt.update()?;
        let names = apt.package_names()?;
        let pkg = pick(spec.package, names.iter().map(String::as_str))
            .with_context(|| format!("no package {} after apt-get update", spec.package))?;
        let image = cache.join(format!("{pkg}.vmlinuz"));
        download(&apt, pkg, &image)?;
        prune(spec, &image);
        return Ok(uncompressed(&image));
    }
    prune(spec, &image);
    Ok(uncompressed(&image))
}

/// Downloads `pkg` and publishes its vmlinuz as `image` (by rename, so readers never see half).
/// `apt-get download PKG` into `dl`: the path of the .deb it left there.
fn download_deb(apt: &PrivateApt, pkg: &str, dl: &Path) -> Result<PathBuf> {
    let mut c = apt.cmd("apt-get", &["download", pkg]);
    c.current_dir(dl).stdout(Stdio::null());
    status(c)?;
    fs::read_dir(dl)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")
}

fn download(apt: &PrivateApt, pkg: &str, image: &Path) -> Result<()> {
    let cache = image.parent().context("image path has no directory")?;
    // Per process: a crashed run leaves its directory, never a half-written image.
    let dl = cache.join(format!("download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dl);
    fs::create_dir_all(&dl)?;
    let res = (|| -> Result<()> {
        let deb = download_deb(apt, pkg, &dl)?;
        // Only /boot: the modules are most of the package and the initramfs loads none.
        let sh = format!(
            "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards './boot/vmlinuz-*'",
            deb.display(),
            dl.display()
        );
        let mut c = Command::new("sh");
        c.args(["-c", &sh]);
        status(c).with_context(|| format!("unpacking /boot of {}", deb.display()))?;
        let vmlinuz = fs::read_dir(dl.join("boot"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
            .context("no vmlinuz in the kernel package")?;
        let tmp = cache.join(format!(".vmlinuz.{}.tmp", std::process::id()));
        fs::copy(&vmlinuz, &tmp)?;
        fs::rename(&tmp, image)?;
        Ok(())
    })();
    let _ = fs::remove_dir_all(&dl);
    res
}

/// Modules a guest loads from its own kernel's package (Debian builds them as modules): `loop`,
/// for the I/O checks (a loop device over a file in the guest's RAM). Best effort: a guest
/// without them reports the checks that need a disk as degraded.
const GUEST_MODULES: &[&str] = &["drivers/block/loop.ko"];

/// The directory of `image`'s kernel's guest modules, decompressed (busybox `insmod` reads plain
/// .ko files), downloading the package again if they were not extracted with the image.
pub fn modules(spec: &Spec, image: &Path) -> Option<PathBuf> {
    let dir = image.with_extension("modules");
    if GUEST_MODULES
        .iter()
        .all(|m| dir.join(module_name(m)).exists())
    {
        return Some(dir);
    }
    let res = (|| -> Result<()> {
        let cache = spec.cache();
        let _lock = Lock::take(&cache.join(".lock"))?;
        let pkg = image
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| {
                n.strip_suffix(".vmlinuz")
                    .or_else(|| n.strip_suffix(".vmlinux"))
            })
            .context("image name is not <package>.vmlinu[xz]")?
            .to_string();
        let apt = PrivateApt::new(spec)?;
        let dl = cache.join(format!("modules-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dl);
        fs::create_dir_all(&dl)?;
        let r = (|| -> Result<()> {
            let deb = download_deb(&apt, &pkg, &dl)?;
            let pats: Vec<String> = GUEST_MODULES
                .iter()
                // ./lib/modules (bullseye, bookworm) or ./usr/lib/modules (trixie's merged /usr).
                .map(|m| format!("'./*lib/modules/*/kernel/{m}*'"))
                .collect();
            let sh = format!(
                "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards {}",
                deb.display(),
                dl.display(),
                pats.join(" ")
            );
            let mut c = Command::new("sh");
            c.args(["-c", &sh]);
            status(c).with_context(|| format!("unpacking modules of {}", deb.display()))?;
            let tmp = cache.join(format!(".modules.{}.tmp", std::process::id()));
            let _ = fs::remove_dir_all(&tmp);
            fs::create_dir_all(&tmp)?;
            for m in GUEST_MODULES {
                let name = module_name(m);
                let found = find_file(&dl, name).with_context(|| format!("{pkg} has no {name}"))?;
                let dest = tmp.join(name);
                let f = found.to_string_lossy();
                let sh = if f.ends_with(".xz") {
                    format!("xz -dc '{f}' > '{}'", dest.display())
                } else if f.ends_with(".zst") {
                    format!("zstd -qdc '{f}' > '{}'", dest.display())
                } else {
                    format!("cp '{f}' '{}'", dest.display())
                };
                let mut c = Command::new("sh");
                c.args(["-c", &sh]);
                status(c).with_context(|| format!("decompressing {f}"))?;
            }
            let _ = fs::remove_dir_all(&dir);
            fs::rename(&tmp, &dir)?;
            Ok(())
        })();
        let _ = fs::remove_dir_all(&dl);
        r
    })();
    match res {
        Ok(()) => Some(dir),
        Err(e) => {
            eprintln!(
                "xtask: {}: no guest modules ({e:#}); the guest has no loop device",
                spec.name
            );
            None
        }
    }
}

/// `loop.ko` for `drivers/block/loop.ko`.
fn module_name(m: &str) -> &str {
    m.rsplit('/').next().unwrap_or(m)
}

/// The first file under `dir` whose name starts with `name` (`loop.ko`, `loop.ko.xz`, …).
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in fs::read_dir(dir).ok()?.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(name))
        {
            return Some(p);
        }
    }
    None
}

/// Cached images of this spec, oldest first.
fn cached(spec: &Spec) -> Vec<PathBuf> {
    let mut v: Vec<(String, PathBuf)> = fs::read_dir(spec.cache())
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter_map(|p| {
                    let name = p
                        .file_name()?
                        .to_str()?
                        .strip_suffix(".vmlinuz")?
                        .to_string();
                    glob_match(spec.package, &name).then_some((name, p))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(|a, b| natural_cmp(&a.0, &b.0));
    v.into_iter().map(|(_, p)| p).collect()
}

/// Removes the spec's images other than `keep`: Debian has replaced them.
fn prune(spec: &Spec, keep: &Path) {
    for old in cached(spec) {
        if old != keep {
            let _ = fs::remove_file(&old);
            let _ = fs::remove_file(old.with_extension("vmlinux"));
        }
    }
}

/// Compressed payloads a bzImage may hold: (magic, decompressor). Debian's 5.10 and 6.1
/// images are xz, 6.12's zstd.
const PAYLOADS: &[(&[u8], &str)] = &[(b"\xfd7zXZ\0", "xz"), (b"\x28\xb5\x2f\xfd", "zstd")];

/// The ELF `vmlinux` inside a bzImage, cached beside it, else the bzImage itself. qemu boots
/// the ELF directly (PVH entry, CONFIG_PVH), skipping the in-guest decompression, which is
/// slow under TCG.
fn uncompressed(bzimage: &Path) -> PathBuf {
    let elf = bzimage.with_extension("vmlinux");
    if elf.exists() {
        return elf;
    }
    let Ok(data) = fs::read(bzimage) else {
        return bzimage.to_path_buf();
    };
    let tmp = elf.with_extension(format!("{}.tmp", std::process::id()));
    let extract = |at: usize, tool: &str| -> Option<()> {
        let out = fs::File::create(&tmp).ok()?;
        let mut child = Command::new(tool)
            .args(["-dc", "-q"])
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take()?;
            // Both complain about the bytes after the stream ("trailing garbage"), after having
            // written all of it: their exit status is not the test, the ELF header is.
            let _ = stdin.write_all(&data[at..]);
        }
        let _ = child.wait();
        let head = fs::read(&tmp).ok()?;
        if head.len() < 1 << 20 || &head[..4] != b"\x7fELF" {
            return None;
        }
        fs::rename(&tmp, &elf).ok()
    };
    for (magic, tool) in PAYLOADS {
        let Some(at) = data.windows(magic.len()).position(|w| w == *magic) else {
            continue;
        };
        if extract(at, tool).is_some() {
            return elf;
        }
    }
    let _ = fs::remove_file(&tmp);
    eprintln!(
        "xtask: could not extract vmlinux from {} (no xz or zstd stream, or the tool is missing); booting the bzImage (slower under TCG)",
        bzimage.display()
    );
    bzimage.to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let p = "linux-image-6.12.*+deb13-amd64-unsigned";
        assert!(glob_match(p, "linux-image-6.12.118+deb13-amd64-unsigned"));
        assert!(!glob_match(
            p,
            "linux-image-6.12.118+deb13-cloud-amd64-unsigned"
        ));
        assert!(!glob_match(
            p,
            "linux-image-6.12.115+deb13.1-amd64-unsigned"
        ));
        assert!(!glob_match(p, "linux-image-6.1.0-57-amd64-unsigned"));
        assert!(glob_match("a*b*c", "a1b2.3c"));
        assert!(!glob_match("a*b*c", "abc"));
        assert!(!glob_match("a*b", "axb"));
        assert!(glob_match("a*.1b", "a1.2.1b"));
        assert!(!glob_match("a*", "a"));
        let exact = "linux-image-5.10.0-30-amd64-unsigned";
        assert!(glob_match(exact, exact));
        assert!(!glob_match(exact, "linux-image-5.10.0-300-amd64-unsigned"));
    }

    #[test]
    fn newest_package_wins() {
        let names = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-57-amd64-unsigned",
            "linux-image-6.1.0-57-amd64",
            "linux-image-6.1.0-57-cloud-amd64-unsigned",
            "linux-image-6.1.0-10-amd64-unsigned",
        ];
        assert_eq!(
            pick("linux-image-6.1.0-*-amd64-unsigned", names),
            Some("linux-image-6.1.0-57-amd64-unsigned")
        );
        let trixie = [
            "linux-image-6.12.99+deb13-amd64-unsigned",
            "linux-image-6.12.118+deb13-amd64-unsigned",
            "linux-image-6.12.118+deb13-rt-amd64-unsigned",
        ];
        assert_eq!(
            pick(KERNELS[2].package, trixie),
            Some("linux-image-6.12.118+deb13-amd64-unsigned")
        );
        assert_eq!(pick(KERNELS[0].package, trixie), None);
        assert_eq!(natural_cmp("a007", "a7"), Ordering::Equal);
        assert_eq!(natural_cmp("a7b", "a7"), Ordering::Greater);
    }

    #[test]
    fn kernel_selection() {
        assert_eq!(select("").unwrap().len(), KERNELS.len());
        assert_eq!(select("all").unwrap().len(), KERNELS.len());
        let s = select("6.12, 5.10,6.12").unwrap();
        assert_eq!(
            s.iter().map(|k| k.name).collect::<Vec<_>>(),
            ["6.12", "5.10"]
        );
        let e = select("4.19").unwrap_err().to_string();
        assert!(e.contains("4.19") && e.contains("5.10, 6.1, 6.12"), "{e}");
        // Every spec names its suites and a distinct cache directory.
        let mut dirs: Vec<&str> = KERNELS.iter().map(|k| k.suites[0]).collect();
        dirs.dedup();
        assert_eq!(dirs.len(), KERNELS.len());
    }
}
