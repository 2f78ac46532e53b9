//! Real containers for the root tests: podman with runc (crun refuses this host's cgroup v1
//! hybrid), images imported offline from a tarball of a root filesystem (no registry), and a
//! guard that removes the containers and the image when the test ends, passed or not.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::output_ok;

/// Output of `podman ARGS`, trimmed; panics with podman's stderr when it fails.
pub fn podman(args: &[&str]) -> String {
    let out = output_ok(
        Command::new("podman").args(args),
        &format!("podman {args:?} (Debian package podman)"),
    );
    String::from_utf8_lossy(&out).trim().to_string()
}

/// podman, runc and busybox-static installed (apt-get when one is missing), and
/// `default_ulimits = []` under `[containers]` in containers.conf: podman's default raises
/// RLIMIT_NPROC, which this host denies.
pub fn podman_ready() {
    let missing = ["/usr/bin/podman", "/usr/sbin/runc", "/bin/busybox"]
        .iter()
        .any(|p| !Path::new(p).exists());
    if missing {
        let st = Command::new("apt-get")
            .args(["install", "-y", "podman", "runc", "busybox-static"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("apt-get");
        assert!(st.success(), "apt-get install podman runc busybox-static");
    }
    let conf_path = "/etc/containers/containers.conf";
    let conf = std::fs::read_to_string(conf_path).unwrap_or_default();
    if conf.contains("default_ulimits") {
        return;
    }
    let with = match conf.split_once("[containers]") {
        Some((head, tail)) => format!("{head}[containers]\ndefault_ulimits = []{tail}"),
        None => format!("{conf}\n[containers]\ndefault_ulimits = []\n"),
    };
    std::fs::write(conf_path, with).expect("writing containers.conf");
}

/// An image made for one test, and the containers started from it: all removed on drop (and
/// the scratch directory handed to `owning`, after the containers that mount it).
pub struct Pod {
    pub image: String,
    names: Vec<String>,
    owned: Option<PathBuf>,
}

impl Pod {
    /// Imports an image named `image` from a root filesystem of busybox-static (`/bin/sh`,
    /// `/bin/sleep`, `/bin/test`, `/bin/[`), an empty `/data`, plus `files` (host path, absolute path in the image), built in `work` and
    /// removed from it once imported: the files then exist only in podman's storage.
    pub fn import(image: &str, work: &Path, files: &[(&Path, &str)]) -> Pod {
        let root = work.join("rootfs");
        for d in ["bin", "tmp", "proc", "sys", "dev", "etc", "data"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        for applet in ["sh", "sleep", "test", "["] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        for (from, to) in files {
            let dest = root.join(to.trim_start_matches('/'));
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::copy(from, dest).unwrap();
        }
        let tar = work.join("rootfs.tar");
        let st = Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&root)
            .arg(".")
            .status()
            .expect("tar");
        assert!(st.success(), "tar of the image's root filesystem");
        podman(&["import", tar.to_str().unwrap(), image]);
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_file(&tar).unwrap();
        Pod {
            image: image.to_string(),
            names: Vec::new(),
            owned: None,
        }
    }

    /// The same pod, which also removes `dir` on drop, once its containers are gone.
    pub fn owning(mut self, dir: &Path) -> Pod {
        self.owned = Some(dir.to_path_buf());
        self
    }

    /// Starts container `name` (runc, detached) running `argv`; returns its first process's
    /// host pid.
    pub fn run(&mut self, name: &str, argv: &[&str]) -> u32 {
        self.run_with(name, &[], argv)
    }

    /// `run` with more `podman run` options (`--memory`, `-v`, …) before the image.
    pub fn run_with(&mut self, name: &str, options: &[&str], argv: &[&str]) -> u32 {
        self.names.push(name.to_string());
        let mut args = vec!["--runtime", "runc", "run", "-d", "--name", name];
        args.extend_from_slice(options);
        args.push(&self.image);
        args.extend_from_slice(argv);
        podman(&args);
        podman(&["inspect", "--format", "{{.State.Pid}}", name])
            .parse()
            .expect("the container's pid")
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("podman")
                .args(["rm", "-f", "-t", "0", n])
                .output();
        }
        let _ = Command::new("podman")
            .args(["rmi", "-f", &self.image])
            .output();
        if let Some(dir) = &self.owned {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
