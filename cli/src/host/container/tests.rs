use super::*;

const PODMAN_ID: &str = "3f1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809";
const DOCKER_ID: &str = "aa11bb22cc33dd44ee55ff6600778899aabbccddeeff00112233445566778899";
const CRI_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const CRIO_ID: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
const UID: &str = "6b3f0e6a-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
const UID2: &str = "11111111-2222-3333-4444-555555555555";

fn m(path: &str) -> Option<(Runtime, String, Option<String>)> {
    classify(path).map(|m| (m.runtime, m.id, m.pod_uid))
}

#[test]
fn path_patterns() {
    let p = |r, id: &str| Some((r, id.to_string(), None));
    // podman: v1 cgroupfs (this host), v2 systemd (root and rootless), in a pod.
    assert_eq!(
        m(&format!("/libpod_parent/libpod-{PODMAN_ID}")),
        p(Runtime::Podman, PODMAN_ID)
    );
    assert_eq!(
        m(&format!("/machine.slice/libpod-{PODMAN_ID}.scope")),
        p(Runtime::Podman, PODMAN_ID)
    );
    assert_eq!(
        m(&format!(
            "/machine.slice/libpod-{PODMAN_ID}.scope/container"
        )),
        p(Runtime::Podman, PODMAN_ID)
    );
    assert_eq!(
        m(&format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{PODMAN_ID}.scope"
        )),
        p(Runtime::Podman, PODMAN_ID)
    );
    // conmon is not in the container.
    assert_eq!(
        m(&format!("/machine.slice/libpod-conmon-{PODMAN_ID}.scope")),
        None
    );
    // docker: cgroupfs and systemd drivers.
    assert_eq!(
        m(&format!("/docker/{DOCKER_ID}")),
        p(Runtime::Docker, DOCKER_ID)
    );
    assert_eq!(
        m(&format!("/system.slice/docker-{DOCKER_ID}.scope")),
        p(Runtime::Docker, DOCKER_ID)
    );
    // Kubernetes: cgroupfs (v1), systemd with containerd and CRI-O (v2).
    let k = |r, id: &str, uid: &str| Some((r, id.to_string(), Some(uid.to_string())));
    assert_eq!(
        m(&format!("/kubepods/burstable/pod{UID}/{CRI_ID}")),
        k(Runtime::Cri, CRI_ID, UID)
    );
    let u = UID.replace('-', "_");
    assert_eq!(
        m(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CRI_ID}.scope"
        )),
        k(Runtime::Containerd, CRI_ID, UID)
    );
    assert_eq!(
        m(&format!(
            "/kubepods.slice/kubepods-pod{u}.slice/crio-{CRIO_ID}.scope"
        )),
        k(Runtime::CriO, CRIO_ID, UID)
    );
    // systemd units; the root, sessions and unknown layouts are the host.
    let s = |u: &str| Some((Runtime::Systemd, u.to_string(), None));
    assert_eq!(
        m("/system.slice/postgresql.service"),
        s("postgresql.service")
    );
    assert_eq!(m("/batch.slice"), s("batch.slice"));
    assert_eq!(m("/system.slice/run-r3c1f.scope"), s("run-r3c1f.scope"));
    assert_eq!(
        m("/user.slice/user-1000.slice/user@1000.service/app.slice/syncthing.service"),
        s("syncthing.service")
    );
    // The root, systemd's own slices, sessions, user managers, init and conmon: the host.
    for host in [
        "/",
        "",
        "/system.slice",
        "/user.slice",
        "/user.slice/user-1000.slice",
        "/user.slice/user-1000.slice/session-3.scope",
        "/user.slice/user-1000.slice/user@1000.service",
        "/user.slice/user-1000.slice/user@1000.service/app.slice",
        "/user.slice/user-1000.slice/user@1000.service/init.scope",
        "/init.scope",
        "/kubepods.slice/kubepods-burstable.slice",
    ] {
        assert_eq!(m(host), None, "{host}");
    }
    // Any other layout falls back to the path: the cgroup is the container.
    let g = |p: &str| Some((Runtime::Cgroup, p.to_string(), None));
    assert_eq!(m("/tk-unknown/app1"), g("/tk-unknown/app1"));
    assert_eq!(m("/tk-unknown/app1/"), g("/tk-unknown/app1"));
    assert_eq!(
        m("/process_api/8650c0330e01b5cecace5756ef9d93a6"),
        g("/process_api/8650c0330e01b5cecace5756ef9d93a6")
    );
    assert_eq!(m("/docker/not-an-id"), g("/docker/not-an-id"));
    assert_eq!(m("/slurm/uid_1000/job_42"), g("/slurm/uid_1000/job_42"));
}

#[test]
fn picks_the_runtime_over_systemd_in_v1_lines() {
    let text = format!(
        "12:memory:/libpod_parent/libpod-{PODMAN_ID}\n1:name=systemd:/system.slice/foo.service\n0::/\n"
    );
    let (m, path) = pick(text.as_bytes()).unwrap();
    assert_eq!(m.runtime, Runtime::Podman);
    assert_eq!(path, format!("/libpod_parent/libpod-{PODMAN_ID}"));
    let (m, _) = pick(b"1:name=systemd:/system.slice/foo.service\n0::/\n").unwrap();
    assert_eq!(m.id, "foo.service");
    assert!(pick(b"4:memory:/\n0::/\n").is_none());
    assert!(pick(b"garbage").is_none());
    // This host's shape: a process in an unknown v1 memory cgroup, the rest at the root.
    let (m, path) = pick(b"9:name=systemd:/\n4:memory:/tk-unknown/app1\n1:cpu:/\n0::/\n").unwrap();
    assert_eq!(
        (m.runtime, m.id.as_str()),
        (Runtime::Cgroup, "/tk-unknown/app1")
    );
    assert_eq!(path, "/tk-unknown/app1");
    // A unit beats an unknown layout; among unknown layouts memory, then v2, then the first.
    let (m, _) =
        pick(b"9:name=systemd:/system.slice/foo.service\n4:memory:/tk/a\n0::/tk/b\n").unwrap();
    assert_eq!(m.id, "foo.service");
    let (m, _) = pick(b"3:cpu:/tk/c\n0::/tk/b\n4:memory:/tk/a\n").unwrap();
    assert_eq!(m.id, "/tk/a");
    let (m, _) = pick(b"3:cpu:/tk/c\n0::/tk/b\n").unwrap();
    assert_eq!(m.id, "/tk/b");
    let (m, _) = pick(b"3:cpu:/tk/c\n5:pids:/tk/d\n").unwrap();
    assert_eq!(m.id, "/tk/c");
    // Named and matched by its path; no id prefix match for a path.
    let c = fixture_root().resolve(&m, "/tk/c");
    assert_eq!((c.name.as_str(), c.label()), ("/tk/c", "/tk/c".to_string()));
    assert!(c.matches("/tk/c") && !c.matches("/tk/"));
}

/// doctor's census: this sandbox's shape (every command in its own memory cgroup under
/// /process_api, tracekit in one of them), a podman container, a unit, a login session.
#[test]
fn census_says_what_was_recognised_and_what_is_the_host() {
    let own = b"4:memory:/process_api/aaa\n1:cpu:/\n0::/\n".as_slice();
    let podman = format!("12:memory:/libpod_parent/libpod-{PODMAN_ID}\n0::/\n");
    let procs: Vec<&[u8]> = vec![
        own,
        own,
        b"4:memory:/process_api/bbb\n0::/\n",
        b"4:memory:/\n1:name=systemd:/user.slice/user-0.slice/session-3.scope\n0::/\n",
        b"1:name=systemd:/system.slice/nginx.service\n0::/\n",
        b"0::/\n",
        podman.as_bytes(),
        podman.as_bytes(),
    ];
    let c = Census::of(own, procs);
    assert_eq!(c.processes, 8);
    assert_eq!(c.host_processes, 4);
    assert_eq!(c.own_cgroup_as_host.as_deref(), Some("/process_api/aaa"));
    assert_eq!(c.by_path, vec![("/process_api/bbb".to_string(), 1)]);
    assert_eq!(
        c.text(),
        "recognised podman 1 container (2 processes), systemd 1 unit (1 process); host 4 processes (the root, systemd's slices, login sessions; tracekit's own cgroup /process_api/aaa, of no runtime's layout); 1 cgroup(s) of no runtime's layout, each a container named by its path (1 process): /process_api/bbb (1)"
    );
    let bare = Census::of(b"0::/\n", [b"0::/\n".as_slice()]);
    assert_eq!(
        bare.text(),
        "recognised no container runtime's layout; host 1 process (the root, systemd's slices, login sessions)"
    );
}

#[test]
fn names_from_state_files() {
    let root = fixture_root();
    let name = |path: String| {
        let m = classify(&path).unwrap();
        root.resolve(&m, &path)
    };
    let c = name(format!("/libpod_parent/libpod-{PODMAN_ID}"));
    assert_eq!((c.runtime, c.name.as_str()), (Runtime::Podman, "pg-main"));
    assert_eq!(c.label(), "pg-main");
    let s = crate::report::findings::Subject::process(812, "postgres").with_container(Some(&c));
    assert_eq!(s.text(), "postgres (pid 812) in container pg-main");
    let c = name(format!("/system.slice/docker-{DOCKER_ID}.scope"));
    assert_eq!((c.runtime, c.name.as_str()), (Runtime::Docker, "web"));
    let u = UID.replace('-', "_");
    let c = name(format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CRI_ID}.scope"
    ));
    assert_eq!(
        (c.namespace.as_deref(), c.pod.as_deref(), c.name.as_str()),
        (Some("shop"), Some("web-7d9f"), "nginx")
    );
    assert_eq!(c.label(), "shop/web-7d9f/nginx");
    assert!(c.matches("nginx") && c.matches(&CRI_ID[..12]) && !c.matches("web"));
    // No log link: namespace and pod from /var/log/pods, the pod's only container.
    let c = name(format!("/kubepods/besteffort/pod{UID2}/{CRIO_ID}"));
    assert_eq!(c.label(), "batch/report-1/worker");
    // Nothing on disk: named by the path.
    let path = format!("/docker/{CRIO_ID}");
    let c = name(path.clone());
    assert_eq!((c.runtime, c.name), (Runtime::Docker, path));
    let c = name("/system.slice/postgresql.service".into());
    assert!(c.matches("postgresql.service") && !c.matches("post"));
}

#[test]
fn caches_stay_bounded_as_processes_come_and_go() {
    let c = Some(Arc::new(Container {
        runtime: Runtime::Cgroup,
        id: "/tk/a".into(),
        name: "/tk/a".into(),
        pod: None,
        namespace: None,
    }));
    let mut cache = Cache::default();
    // 10,000 short-lived processes, each gone soon after it was seen; pids 1..=10 live on.
    let alive = |p: u32| p <= 10;
    for pid in 1..=10_000u32 {
        cache.remember_pid(pid, c.clone(), 64, alive);
        assert!(
            cache.by_pid.len() <= 64,
            "{} at pid {pid}",
            cache.by_pid.len()
        );
        cache.remember_path(format!("/tk/{pid}"), c.clone(), 64);
        assert!(cache.by_path.len() <= 64);
    }
    // The dead are forgotten first: the live ones are still known.
    for pid in 1..=10 {
        assert!(cache.by_pid.contains_key(&pid), "live pid {pid} kept");
    }
    assert!(cache.by_pid.contains_key(&10_000));
    // All alive and the cache full: it starts over rather than grow.
    let mut full = Cache::default();
    for pid in 1..=200u32 {
        full.remember_pid(pid, None, 64, |_| true);
        assert!(full.by_pid.len() <= 64);
    }
}

#[test]
fn own_process_is_resolved_and_cached() {
    let me = std::process::id();
    let a = of_pid(me);
    assert_eq!(a, of_pid(me));
    assert_eq!(of_pid(0), None);
    let (pids, _) = pids_of("no-such-container-anywhere");
    assert!(pids.is_empty());
}
