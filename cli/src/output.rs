//! Where a report goes: stdout, or `--output FILE` written atomically (a temporary file in the
//! same directory, renamed over FILE when the run ends), so an existing FILE is never truncated
//! before its replacement is complete.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("refusing to write {0}: it is a symbolic link")]
    Symlink(PathBuf),
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

pub enum Sink {
    Stdout,
    File {
        tmp: PathBuf,
        dest: PathBuf,
        file: File,
        done: bool,
    },
}

impl Sink {
    pub fn open(path: Option<&Path>) -> Result<Sink, OutputError> {
        let Some(dest) = path else {
            return Ok(Sink::Stdout);
        };
        if let Ok(meta) = fs::symlink_metadata(dest) {
            if meta.file_type().is_symlink() {
                return Err(OutputError::Symlink(dest.to_path_buf()));
            }
        }
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tracekit-{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o644)
            .open(&tmp)
            .map_err(|source| OutputError::Io {
                path: tmp.clone(),
                source,
            })?;
        Ok(Sink::File {
            tmp,
            dest: dest.to_path_buf(),
            file,
            done: false,
        })
    }

    pub fn write(&mut self, s: &str) -> Result<(), OutputError> {
        match self {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                // A closed pipe (`| head`) is not an error worth a message.
                match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
                    Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(OutputError::Io {
                        path: PathBuf::from("<stdout>"),
                        source: e,
                    }),
                    _ => Ok(()),
                }
            }
            Sink::File { tmp, file, .. } => {
                file.write_all(s.as_bytes())
                    .map_err(|source| OutputError::Io {
                        path: tmp.clone(),
                        source,
                    })
            }
        }
    }

    /// Makes the file complete: fsync, then rename over the destination.
    pub fn finish(&mut self) -> Result<(), OutputError> {
        if let Sink::File {
            tmp,
            dest,
            file,
            done,
        } = self
        {
            let io = |path: &Path| {
                let path = path.to_path_buf();
                move |source| OutputError::Io { path, source }
            };
            file.sync_all().map_err(io(tmp))?;
            // Checked again: a symlink planted while we ran is not followed by rename(2) anyway
            // (it replaces the link itself), but say so rather than surprise.
            if let Ok(meta) = fs::symlink_metadata(&*dest) {
                if meta.file_type().is_symlink() {
                    return Err(OutputError::Symlink(dest.clone()));
                }
            }
            fs::rename(&*tmp, &*dest).map_err(io(dest))?;
            *done = true;
        }
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Sink::File {
            tmp, done: false, ..
        } = self
        {
            let _ = fs::remove_file(tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tk-out-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn existing_file_survives_until_finish() {
        let d = tmpdir("atomic");
        let dest = d.join("report.json");
        fs::write(&dest, "old\n").unwrap();
        let mut s = Sink::open(Some(&dest)).unwrap();
        s.write("new\n").unwrap();
        assert_eq!(fs::read_to_string(&dest).unwrap(), "old\n");
        s.finish().unwrap();
        assert_eq!(fs::read_to_string(&dest).unwrap(), "new\n");
        assert_eq!(
            fs::read_dir(&d).unwrap().count(),
            1,
            "temporary file left behind"
        );
    }

    #[test]
    fn abandoned_output_leaves_old_file_and_no_temp() {
        let d = tmpdir("abandon");
        let dest = d.join("r.txt");
        fs::write(&dest, "old").unwrap();
        {
            let mut s = Sink::open(Some(&dest)).unwrap();
            s.write("partial").unwrap();
        }
        assert_eq!(fs::read_to_string(&dest).unwrap(), "old");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
    }

    #[test]
    fn refuses_symlink() {
        let d = tmpdir("symlink");
        let target = d.join("target");
        fs::write(&target, "precious").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = Sink::open(Some(&link)).err().unwrap();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
    }
}
